"""The host's own way into a turn's sandbox: ``Turn.exec`` and the file primitives.

Policy only, no I/O: this module checks what the host passes (the host's
mistakes raise ``UsageError`` before anything is sent), builds the session's
requests, and plans a file transfer as a generator of ``FsRequest`` steps that
a sync and an async driver in ``executor.Turn`` run, so the two share one body.
A refusal from the sandbox becomes the builtin-compatible error in
``errors.py`` that matches its errno.

The bounds, each documented in ``docs/exec-and-files.md``:

* argv: at most ``ARGV_BYTES`` in all (the kernel's own ``ARG_MAX``); one
  string longer than the kernel's 128 KiB is the command's failure (126, E2BIG).
* ``input``: at most ``INPUT_BYTES``.
* ``env``: at most ``ENV_BYTES`` in all; names non-empty, without ``=``.
* no NUL anywhere in argv, cwd or env; argv[0] not empty.
* no lone surrogate in env or cwd (JSON text would carry it as ``?``); in
  argv only ``os.fsdecode``'s escapes of non-UTF-8 bytes.
* ``timeout``: above 0 and at most ``MAX_TIMEOUT`` seconds; the turn's tool
  timeout when omitted.
* output: ``OUTPUT_BYTES`` of each stream kept, the rest dropped
  (``ExecResult.truncated``).
* files: ``FILE_BYTES`` at most, read or written.
* detached processes (``Turn.start``): at most ``DETACHED_PER_TURN`` at once,
  each counted until everything it started has ended; the first ``LOG_BYTES``
  of each one's merged output kept; ``timeout`` optional (until the turn ends).
"""

from __future__ import annotations

import errno
import math
import os
import posixpath
from collections.abc import Generator, Mapping, Sequence

from .errors import (
    FileTooLargeError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    UsageError,
)
from .sandbox._api import DetachRequest, ExecRequest, FsReply, FsRequest
from .sandbox.server._fsops import CHUNK_BYTES
from .sandbox.server._protocol import DETACHED_PER_TURN

__all__ = [
    "ARGV_BYTES",
    "CHUNK_BYTES",
    "DETACHED_PER_TURN",
    "ENV_BYTES",
    "FILE_BYTES",
    "INPUT_BYTES",
    "LOG_BYTES",
    "MAX_TIMEOUT",
    "OUTPUT_BYTES",
    "RESERVED_ENV",
    "detach_request",
    "exec_request",
    "list_plan",
    "read_plan",
    "write_plan",
]

#: The most bytes of argv (each string's UTF-8 and its NUL), the kernel's usual ARG_MAX.
ARGV_BYTES = 2 << 20
#: The most bytes of ``input`` (the request's frame carries argv and input together).
INPUT_BYTES = 60 << 20
#: The most bytes of ``env`` names and values together.
ENV_BYTES = 256 << 10
#: Bytes kept of each of stdout and stderr (inspect_ai's default exec bound is 10 MiB).
OUTPUT_BYTES = 10 << 20
#: Characters kept of a detached process's merged output (its log); the rest is dropped.
LOG_BYTES = 64 << 10
#: The longest timeout ``exec`` accepts, in seconds.
MAX_TIMEOUT = 24 * 3600.0
#: The most bytes ``read_file`` returns and ``write_file`` writes (inspect_ai's default).
FILE_BYTES = 100 << 20
#: Variables the sandbox sets per call that a host's ``env`` may not replace.
RESERVED_ENV = frozenset({"VESSEL_OUTBOX"})

# Which error each refusal raises, by errno name; any other is a plain SandboxFileError.
_ERRORS: Mapping[str, type[SandboxFileError]] = {
    "ENOENT": SandboxFileNotFoundError,
    "EISDIR": SandboxIsADirectoryError,
    "ENOTDIR": SandboxNotADirectoryError,
    "EACCES": SandboxPermissionError,
    "EPERM": SandboxPermissionError,
    "EROFS": SandboxPermissionError,
    "EFBIG": FileTooLargeError,
}


def _no_nul(what: str, text: str) -> None:
    if "\0" in text:
        raise UsageError(f"{what} may not contain a NUL character")


def _unicode(what: str, text: str, *, escaped_bytes: bool = False) -> None:
    """Refuse text that cannot reach the sandbox as itself.

    argv travels as bytes, so ``os.fsdecode``'s escapes (U+DC80-U+DCFF) carry a
    non-UTF-8 byte there; env and cwd travel as JSON text, where any lone
    surrogate would arrive as ``?``: another value than the host asked for.
    """
    try:
        text.encode("utf-8", "surrogateescape" if escaped_bytes else "strict")
    except UnicodeEncodeError as error:
        kind = "an argument" if escaped_bytes else "text"
        raise UsageError(
            f"{what} holds {text[error.start]!r}, a lone surrogate that is not valid in {kind} "
            "the sandbox can receive"
        ) from None


def _argv(argv: object) -> tuple[str, ...]:
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise UsageError(
            f"argv must be a sequence of strings such as ['ls', '-l'], not {type(argv).__name__}"
        )
    if not argv:
        raise UsageError("argv must name a command: it is empty")
    for index, part in enumerate(argv):
        if not isinstance(part, str):
            raise UsageError(f"argv[{index}] must be a string, not {type(part).__name__}")
        _no_nul(f"argv[{index}]", part)
        _unicode(f"argv[{index}]", part, escaped_bytes=True)
    if not argv[0]:
        raise UsageError("argv[0] must name a command: it is an empty string")
    size = sum(len(part.encode("utf-8", "surrogateescape")) + 1 for part in argv)
    if size > ARGV_BYTES:
        raise UsageError(f"argv is {size} bytes; the bound is {ARGV_BYTES} (ARG_MAX)")
    return tuple(argv)


def _input(data: object) -> bytes:
    if data is None:
        return b""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"input must be bytes or str, not {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > INPUT_BYTES:
        raise UsageError(f"input is {len(raw)} bytes; the bound is {INPUT_BYTES}")
    return raw


def _env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise UsageError(f"env must be a mapping of names to strings, not {type(env).__name__}")
    size = 0
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise UsageError(f"env must map strings to strings; got {name!r}: {value!r}")
        if not name or "=" in name:
            raise UsageError(f"env name {name!r} must be non-empty and without '='")
        _no_nul(f"env[{name!r}]", name + value)
        _unicode(f"env[{name!r}]", name + value)
        if name in RESERVED_ENV:
            raise UsageError(f"env may not set {name}: the sandbox sets it for each call")
        size += len(name.encode("utf-8", "surrogateescape")) + len(
            value.encode("utf-8", "surrogateescape")
        )
    if size > ENV_BYTES:
        raise UsageError(f"env is {size} bytes; the bound is {ENV_BYTES}")
    return dict(env)


def _cwd(cwd: object, workdir: str) -> str | None:
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd:
        raise UsageError(f"cwd must be a non-empty sandbox path, not {cwd!r}")
    _no_nul("cwd", cwd)
    _unicode("cwd", cwd)
    return posixpath.normpath(posixpath.join(workdir, cwd))


def _timeout(timeout: object, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise UsageError(f"timeout must be a number of seconds, not {timeout!r}")
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise UsageError(f"timeout must be above 0 and at most {MAX_TIMEOUT:g} s, not {timeout!r}")
    return float(timeout)


def exec_request(
    argv: object,
    *,
    input: object,
    cwd: object,
    env: object,
    timeout: object,
    default_timeout: float,
    workdir: str,
) -> ExecRequest:
    """Check ``Turn.exec``'s arguments and build the session's request; raise ``UsageError``."""
    return ExecRequest(
        argv=_argv(argv),
        stdin=_input(input),
        cwd=_cwd(cwd, workdir),
        env=_env(env),
        timeout=_timeout(timeout, default_timeout),
        output_bytes=OUTPUT_BYTES,
    )


def detach_request(
    argv: object, *, input: object, cwd: object, env: object, timeout: object, workdir: str
) -> DetachRequest:
    """Check ``Turn.start``'s arguments and build the session's request; raise ``UsageError``."""
    return DetachRequest(
        argv=_argv(argv),
        stdin=_input(input),
        cwd=_cwd(cwd, workdir),
        env=_env(env),
        timeout=None if timeout is None else _timeout(timeout, 0.0),
        log_chars=LOG_BYTES,
    )


def _path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise UsageError(f"path must be a non-empty sandbox path, not {path!r}")
    _no_nul("path", path)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate would reach the sandbox as another name.
        raise UsageError(f"path {path!r} is not valid Unicode") from None
    return path


def _raise_for(reply: FsReply, path: str) -> None:
    if reply.errno is None:
        return
    cls = _ERRORS.get(reply.errno, SandboxFileError)
    code = getattr(errno, reply.errno, errno.EIO)
    raise cls(code, reply.message or os.strerror(code), path)


# Each plan yields the requests to send and receives each reply; it returns the answer.


def read_plan(path: object, *, timeout: float) -> Generator[FsRequest, FsReply, bytes]:
    """Read a whole file in ``CHUNK_BYTES`` steps; ``FileTooLargeError`` past ``FILE_BYTES``."""
    where = _path(path)
    chunks: list[bytes] = []
    offset = 0
    while True:
        reply = yield FsRequest(
            op="read", path=where, timeout=timeout, offset=offset, length=CHUNK_BYTES
        )
        _raise_for(reply, where)
        size = reply.fields.get("size")
        total = offset + len(reply.data)
        if (isinstance(size, int) and size > FILE_BYTES) or total > FILE_BYTES:
            shown = size if isinstance(size, int) and size > total else total
            raise FileTooLargeError(
                errno.EFBIG,
                f"the file is {shown} bytes or more; read_file returns at most {FILE_BYTES}",
                where,
            )
        chunks.append(reply.data)
        offset = total
        # A short read is the end (a file that grows meanwhile is read on, within the bound).
        if len(reply.data) < CHUNK_BYTES:
            return b"".join(chunks)


def write_plan(
    path: object, data: object, *, timeout: float
) -> Generator[FsRequest, FsReply, None]:
    """Write a whole file in ``CHUNK_BYTES`` steps, making missing folders on the way."""
    where = _path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"data must be bytes or str, not {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > FILE_BYTES:
        raise UsageError(f"data is {len(raw)} bytes; write_file writes at most {FILE_BYTES}")
    offset = 0
    while True:
        chunk = raw[offset : offset + CHUNK_BYTES]
        reply = yield FsRequest(
            op="write",
            path=where,
            timeout=timeout,
            offset=offset,
            data=chunk,
            truncate=offset == 0,
            make_parents=offset == 0,
        )
        _raise_for(reply, where)
        offset += len(chunk)
        if offset >= len(raw):
            return


def list_plan(
    path: object, *, timeout: float
) -> Generator[FsRequest, FsReply, list[tuple[str, str]]]:
    """List a folder: ``(name, kind)`` pairs, kind ``file``, ``dir``, ``link`` or ``other``."""
    where = _path(path)
    reply = yield FsRequest(op="list", path=where, timeout=timeout)
    _raise_for(reply, where)
    entries = reply.fields.get("entries")
    if not isinstance(entries, list):
        return []
    return [
        (str(entry[0]), str(entry[1]))
        for entry in entries
        if isinstance(entry, list) and len(entry) == 2
    ]
