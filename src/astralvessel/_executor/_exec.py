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
* files: ``FILE_BYTES`` at most, read or written; paths as the os module takes
  them (``os.fsdecode``'s escapes of non-UTF-8 bytes, no NUL).
* ``list_dir``: at most ``limit`` entries (1 to ``LIST_MAX_ENTRIES``), and the
  ``Listing`` says when the folder held more.
* detached processes (``Turn.start``): at most ``DETACHED_PER_TURN`` at once,
  each counted until everything it started has ended; the first ``LOG_BYTES``
  of each one's merged output kept; ``timeout`` optional (until the turn ends).
* ``user``: a name (at most ``USER_NAME_CHARS``, no NUL, ``:`` or newline) or
  a uid (0 to ``MAX_ID``), only under ``root_identity``; the name is looked up
  in the first ``PASSWD_BYTES`` of the sandbox's own ``/etc/passwd``.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence

import attrs

from .._ground._seconds import MAX_TIMEOUT, check_seconds
from ..errors import (
    FileTooLargeError,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    UsageError,
)
from ..sandbox._api import MAX_ID, DetachRequest, ExecRequest, ExecResult, FsReply, FsRequest
from ..sandbox.server._fsops import CHUNK_BYTES, LIST_MAX_ENTRIES
from ..sandbox.server._protocol import DETACHED_PER_TURN

__all__ = [
    "ARGV_BYTES",
    "CHUNK_BYTES",
    "DETACHED_PER_TURN",
    "ENV_BYTES",
    "FILE_BYTES",
    "INPUT_BYTES",
    "LIST_MAX_ENTRIES",
    "LOG_BYTES",
    "MAX_TIMEOUT",
    "OUTPUT_BYTES",
    "PASSWD_BYTES",
    "RESERVED_ENV",
    "USER_NAME_CHARS",
    "Listing",
    "detach_request",
    "exec_plan",
    "exec_request",
    "find_user",
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
#: The most bytes ``read_file`` returns and ``write_file`` writes (inspect_ai's default).
FILE_BYTES = 100 << 20
#: The most bytes of the sandbox's /etc/passwd read to find a user.
PASSWD_BYTES = CHUNK_BYTES
#: The longest user name ``exec(user=)`` takes (NSS's own bound; useradd's is 32).
USER_NAME_CHARS = 256
#: What an exec whose user the sandbox does not know returns, as ``docker exec -u`` does.
EXIT_NO_USER = 126
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


# Refusals after which a write leaves part of its data behind, filling the disk.
_OUT_OF_SPACE = frozenset({"ENOSPC", "EFBIG", "EDQUOT"})


def _no_nul(what: str, text: str) -> None:
    # "embedded null byte" is CPython's subprocess wording, which inspect_ai turns into a
    # tool error the model sees (any other ValueError fails the whole sample).
    if "\0" in text:
        raise UsageError(f"{what} may not contain a NUL character (an embedded null byte)")


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


def _bytes(what: str, data: object) -> bytes:
    """``data`` as bytes: str as UTF-8, where a lone surrogate is the host's mistake."""
    if isinstance(data, str):
        _unicode(what, data)
        return data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UsageError(f"{what} must be bytes or str, not {type(data).__name__}")
    return bytes(data)


def _input(data: object) -> bytes:
    if data is None:
        return b""
    raw = _bytes("input", data)
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
    return default if timeout is None else check_seconds("timeout", timeout)


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


def _user(user: object, *, root_identity: bool) -> str | int | None:
    """Check ``exec``'s ``user``: a name or a uid; ``UsageError`` for anything else."""
    if user is None:
        return None
    if not root_identity:
        raise UsageError(
            f"user={user!r} needs the root identity (Policy.root_identity, [sandbox] "
            "root_identity): without it every command runs as the turn's one user"
        )
    if user == "root":
        return 0  # the root identity's own uid, whatever the sandbox's passwd says
    if isinstance(user, str) and user.isascii() and user.isdigit():
        user = int(user)
    if isinstance(user, int) and not isinstance(user, bool):
        if not 0 <= user <= MAX_ID:
            raise UsageError(f"user must be a uid from 0 to {MAX_ID}, not {user}")
        return user
    if not isinstance(user, str) or not user:
        raise UsageError(f"user must be a user name or a uid, not {user!r}")
    if len(user) > USER_NAME_CHARS or any(c in user for c in "\0:\n"):
        raise UsageError(
            f"user must be a name of at most {USER_NAME_CHARS} characters without NUL, ':' "
            f"or a newline, not {user[:64]!r}"
        )
    return user


def _passwd_id(field: bytes) -> int | None:
    if not (field.isdigit() and len(field) <= 10):
        return None
    value = int(field)
    return value if value <= MAX_ID else None


def find_user(passwd: bytes, user: str | int) -> tuple[int, int] | None:
    """The uid and primary gid of ``user`` in the text of an /etc/passwd, or None.

    A name must match a line's first field exactly; a uid matches a line's uid,
    and one no line names keeps itself as its gid. Lines that are not
    ``name:password:uid:gid:...`` with ids in range are skipped. Pure: the
    text comes from the sandbox, where the calls may have written anything.
    """
    wanted = user.encode("utf-8", "surrogateescape") if isinstance(user, str) else None
    for line in passwd.split(b"\n"):
        fields = line.split(b":")
        if len(fields) < 4:
            continue
        uid, gid = _passwd_id(fields[2]), _passwd_id(fields[3])
        if uid is None or gid is None:
            continue
        if fields[0] == wanted or (wanted is None and uid == user):
            return uid, gid
    return None if wanted is not None else (int(user), int(user))


def _no_user(user: str | int, why: str) -> ExecResult:
    message = f"astralvessel: unable to find user {user!r}: {why}\n"
    return ExecResult(returncode=EXIT_NO_USER, stderr=message.encode("utf-8", "replace"))


def exec_plan(
    request: ExecRequest, user: object, *, root_identity: bool, timeout: float
) -> Generator[FsRequest, FsReply, ExecRequest | ExecResult]:
    """Resolve ``exec``'s ``user`` in the sandbox's own /etc/passwd, read as the calls' user.

    Returns ``request`` with the user's uid and gid, or, for a user the sandbox
    does not know, the failed ``ExecResult`` (``EXIT_NO_USER``, the user named
    on stderr) the command would have. Raises ``UsageError`` for a bad
    ``user``, or any ``user`` without ``root_identity``.
    """
    wanted = _user(user, root_identity=root_identity)
    if wanted is None:
        return request
    if wanted == 0:
        return request  # root: the root identity's own uid and gid, the prepared call's
    reply = yield FsRequest(op="read", path="/etc/passwd", timeout=timeout, length=PASSWD_BYTES)
    # A passwd that cannot be read lists nobody: a uid still runs, with itself as its gid.
    passwd, why = reply.data, "no matching entry in the sandbox's /etc/passwd"
    size = reply.fields.get("size")
    if reply.errno is not None:
        passwd, why = b"", f"the sandbox's /etc/passwd cannot be read ({reply.message})"
    elif isinstance(size, int) and size > PASSWD_BYTES:
        passwd, why = b"", f"the sandbox's /etc/passwd is over {PASSWD_BYTES} bytes"
    ids = find_user(passwd, wanted)
    if ids is None:
        return _no_user(wanted, why)
    # (0, 0) are the root identity's own ids: the prepared call has them already.
    return request if ids == (0, 0) else attrs.evolve(request, user=ids)


def _path(path: object) -> str:
    """A sandbox path as the os module takes one: str, with ``os.fsdecode``'s escapes of
    non-UTF-8 bytes (as ``list_dir`` gives such names); never NUL or another surrogate."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise UsageError(f"path must be a non-empty sandbox path, not {path!r}")
    _no_nul("path", path)
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as error:
        # No byte string decodes to it: it would reach the sandbox as another name.
        raise UsageError(
            f"path {path!r} holds {path[error.start]!r}, a lone surrogate that stands for no "
            "byte of a file name (only os.fsdecode's escapes U+DC80-U+DCFF do)"
        ) from None
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
    """Write a whole file in ``CHUNK_BYTES`` steps, making missing folders on the way.

    A write the disk cannot hold leaves the file empty, not a partial copy that
    keeps the turn's disk full.
    """
    where = _path(path)
    raw = _bytes("data", data)
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
        if reply.errno in _OUT_OF_SPACE:
            # What was written of it would hold the turn's disk full: empty the file, then raise.
            yield FsRequest(op="write", path=where, timeout=timeout, truncate=True)
        _raise_for(reply, where)
        offset += len(chunk)
        if offset >= len(raw):
            return


class Listing(list[tuple[str, str]]):
    """What ``Turn.list_dir`` returns: a list of ``(name, kind)`` in name order, and
    ``truncated``, true when the folder held more entries than the listing shows.

    A name that is not UTF-8 holds ``os.fsdecode``'s escapes of its bytes, as
    ``os.listdir`` gives it, and reaches the same file when passed back.
    """

    truncated: bool

    def __init__(self, entries: Iterable[tuple[str, str]] = (), *, truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated

    def __repr__(self) -> str:
        return f"Listing({list.__repr__(self)}, truncated={self.truncated!r})"


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise UsageError(f"limit must be a number of entries, not {limit!r}")
    if not 1 <= limit <= LIST_MAX_ENTRIES:
        raise UsageError(f"limit must be from 1 to {LIST_MAX_ENTRIES} entries, not {limit}")
    return limit


def _entries(records: bytes) -> Iterator[tuple[str, str]]:
    """Parse the server's ``KIND/NAME\\0`` records; names as ``os.fsdecode`` gives them."""
    for record in records.split(b"\0")[:-1]:
        kind, _, name = record.partition(b"/")
        yield name.decode("utf-8", "surrogateescape"), kind.decode("ascii", "replace")


def list_plan(
    path: object, *, timeout: float, limit: object = LIST_MAX_ENTRIES
) -> Generator[FsRequest, FsReply, Listing]:
    """List a folder: ``(name, kind)`` pairs, kind ``file``, ``dir``, ``link`` or ``other``.

    At most ``limit`` entries: past it, an arbitrary ``limit`` of them, sorted,
    with ``truncated`` set.
    """
    where = _path(path)
    most = _limit(limit)
    reply = yield FsRequest(op="list", path=where, timeout=timeout, limit=most)
    _raise_for(reply, where)
    return Listing(_entries(reply.data), truncated=bool(reply.fields.get("more")))
