"""What the host sends for each kind of request, and what it keeps while it waits.

One small function per request kind, picked by the request's type
(``MESSAGES``): each gives the ``server/_messages`` message, the frame's body and
the ``Pending`` the reader thread fills in. The session (``_session``) numbers,
sends and waits; it never spells a field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..errors import SandboxError
from ._api import DetachRequest, ExecRequest, FsRequest, RunRequest
from ._pending import Pending
from .server._messages import Adopt, FileOp, Freeze, Message, Restore, Run, Snapshot

__all__ = ["MESSAGES", "AdoptRequest", "Outgoing"]

#: A request as it goes out: its message, the frame's body, and what waits for the answer.
Outgoing = tuple[Message, bytes, Pending]


def _command(request: RunRequest | ExecRequest | DetachRequest, **fields: Any) -> tuple[Run, bytes]:
    """A command's message and body: argv first in the body, NUL-separated (a command
    line as long as the kernel takes, 2 MiB, would not fit the 1 MiB frame header), then
    stdin."""
    if any("\0" in part for part in request.argv):
        # NUL separates argv in the body; no argv string can hold one anyway.
        raise SandboxError("the sandbox server failed a call: argv may not contain NUL")
    argv = b"\0".join(part.encode("utf-8", "surrogateescape") for part in request.argv)
    return Run(argv_bytes=len(argv), cwd=request.cwd, **fields), argv + request.stdin


def _run(request: RunRequest) -> Outgoing:
    """A tool call: one merged stream, bounded in characters; outbox files come back."""
    chars = request.output_chars
    message, body = _command(request, timeout=request.timeout, output_chars=chars)
    return message, body, Pending("run", output_chars=chars)


def _exec(request: ExecRequest) -> Outgoing:
    """A host's command: stdout and stderr apart, each bounded in bytes."""
    message, body = _command(
        request,
        split=True,
        timeout=request.timeout,
        output_chars=0,
        output_bytes=request.output_bytes,
        env=dict(request.env),
        user=None if request.user is None else list(request.user),
    )
    return message, body, Pending("exec", output_bytes=request.output_bytes)


def _detach(request: DetachRequest) -> Outgoing:
    """A detached process: the answer is that it runs; its exit comes later."""
    message, body = _command(
        request,
        detach=True,
        # 0: no deadline; the process lives until the turn ends.
        timeout=request.timeout or 0,
        output_chars=request.log_chars,
        env=dict(request.env),
    )
    return message, body, Pending("detach", output_chars=request.log_chars)


#: The file requests that travel as a message of their own (``_snapfiles`` in the server).
_FILE_MESSAGES: dict[str, type[FileOp]] = {"pack": Snapshot, "unpack": Restore, "freeze": Freeze}


def _fs(request: FsRequest) -> Outgoing:
    """A file primitive, or a snapshot's pack or unpack (their own fields in ``fields``)."""
    try:
        message = _FILE_MESSAGES.get(request.op, FileOp)(
            op=request.op,
            path=request.path,
            timeout=request.timeout,
            offset=request.offset,
            length=request.length,
            limit=request.limit,
            truncate=request.truncate,
            make_parents=request.make_parents,
            view=request.view,
            arguments=dict(request.arguments),
            **request.fields,
        )
    except (TypeError, ValueError) as exc:
        raise SandboxError(f"the file request cannot be sent: {exc}") from None
    return message, request.data, Pending("fs")


@attrs.frozen(kw_only=True)
class AdoptRequest:
    """Lay a fresh sandbox's workspace on the frozen layer just passed on its adoption
    socket (``SandboxSession``'s ``adopt``); answered as a file request."""

    timeout: float = attrs.field(validator=attrs.validators.gt(0))
    #: No layer was passed: the host laid the overlay on the workspace itself (root's
    #: Docker host, ``docker._adoption``), and the server only checks it and makes its
    #: outbox and views again.
    laid: bool = False


def _adopt(request: AdoptRequest) -> Outgoing:
    return Adopt(laid=request.laid), b"", Pending("fs")


#: The message each kind of request sends, by the request's type.
MESSAGES: dict[type[Any], Callable[[Any], Outgoing]] = {
    RunRequest: _run,
    ExecRequest: _exec,
    DetachRequest: _detach,
    FsRequest: _fs,
    AdoptRequest: _adopt,
}
