"""A call in the sandbox server, as values: its checked request, its running state and
its ``exit`` frame (stdlib only, Python 3.8+).

The loop (``_main``) starts, pumps and reaps calls; what a request may say, what a
call counts while it runs, and what its answer carries are decided here, without
touching a pipe or a process. Three kinds of call share one ``Call``: a tool call
(one merged text stream, bounded in characters, outbox files returned), an exec
(stdout and stderr apart, each bounded in bytes) and a detached process
(``Turn.start``: one merged log; its namespace outlives its command).
"""

from __future__ import annotations

import time

from . import _launch, _protocol

# Annotations only: importing typing costs every turn's start a few milliseconds, and
# mypy reads any ``if TYPE_CHECKING:`` block as taken.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._messages import Run

__all__ = [
    "Call",
    "RunOrder",
    "exit_frame",
    "map_path",
    "outcome",
    "parse_run",
    "refusal",
    "status_values",
]

#: The highest uid or gid a user namespace can map ((uid_t) -1 is "no id").
_MAX_ID = 0xFFFFFFFE

#: What stopped a call for memory, on every kind's ``exit`` frame: the memory watch
#: (``[held, limit]``, and how many of the call's processes hid their descriptors from
#: it), or the kernel's OOM killer (how many it took, and the group's limit then, which
#: may be lower than the one the host configured).
_MEMORY_FIELDS = (
    ("memory", "memory_stopped"),
    ("oom_killed", "oom_killed"),
    ("oom_limit", "oom_limit"),
)
#: Which other bound of the turn the call met, on every kind's ``exit`` frame: its
#: processes at their limit (``[held, limit]``, seen by the watch) and the workspace
#: left full by it (``[used, size]`` in bytes, at its end; see ``_bounds``).
_BOUND_FIELDS = (
    *_MEMORY_FIELDS,
    ("processes", "processes_reached"),
    ("disk", "disk_full"),
)
#: What each kind of call's ``exit`` frame carries beyond the fields every kind has:
#: the frame's key and the ``Call`` attribute it reports. An exec counts bytes per
#: stream; a tool call and a detached process count characters of one text. A tool
#: call's outbox files come with its frame as ``extra`` (see ``exit_frame``).
EXIT_FIELDS = {
    "call": (*_BOUND_FIELDS, ("dropped_chars", "dropped_chars")),
    "detached": (*_BOUND_FIELDS, ("dropped_chars", "dropped_chars")),
    "exec": (*_BOUND_FIELDS, ("dropped_bytes", "dropped_bytes")),
}


def map_path(path: str, path_map: dict[str, str]) -> str:
    """Rewrite a sandbox path through ``path_map`` (longest prefix wins); others are unchanged."""
    for prefix in sorted(path_map, key=len, reverse=True):
        base = prefix.rstrip("/")
        if path in (prefix, base) or path.startswith(base + "/"):
            return path_map[prefix].rstrip("/") + path[len(base) :]
    return path


class RunOrder:
    """A checked ``run`` request: a tool call (one merged text stream, bounded in
    characters) or an exec (``split``: stdout and stderr apart, each bounded in bytes)."""

    def __init__(  # noqa: PLR0917 - plain record of a parsed request
        self,
        argv: list[str],
        cwd: str,
        timeout: float,
        output_chars: int,
        stdin: bytes,
        split: bool = False,
        output_bytes: int = 0,
        env: dict[str, str] | None = None,
        detach: bool = False,
        identity: tuple[int, int] | None = None,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.timeout = timeout
        self.output_chars = output_chars
        self.stdin = stdin
        self.split = split
        self.output_bytes = output_bytes
        self.env = env or {}
        #: A detached process (``Turn.start``): its namespace outlives its command, until
        #: it is empty or the turn ends; no timeout unless one is given.
        self.detach = detach
        #: The uid and gid an exec's call sees (``Turn.exec(user=)``); None: the turn's own.
        self.identity = identity


class Call:
    """One running call, from fork until its exit frame is sent."""

    def __init__(self, call_id: int, spawned: _launch.Spawned, order: RunOrder) -> None:
        self.id = call_id
        self.spawned = spawned
        self.started = time.monotonic()
        no_deadline = order.detach and order.timeout <= 0
        self.deadline = float("inf") if no_deadline else self.started + order.timeout
        self.detach = order.detach
        #: Which row of ``EXIT_FIELDS`` its answer takes.
        self.kind = "detached" if order.detach else "exec" if order.split else "call"
        #: A detached call's ``exit`` frame went out when its command exited (init's ``X``).
        self.exit_sent = False
        self.output_chars = order.output_chars
        self.kept_chars = 0
        self.dropped_chars = 0
        self.cut = False
        #: An exec's streams: bytes kept so far and bytes dropped past ``output_bytes``, each.
        self.split = order.split
        self.output_bytes = order.output_bytes
        self.kept_bytes = {"stdout": 0, "stderr": 0}
        self.dropped_bytes = {"stdout": 0, "stderr": 0}
        self.errors_open = order.split
        self.stdin = memoryview(b"")
        self.status: int | None = None
        self.drain_deadline: float | None = None
        self.output_open = True
        self.timed_out = False
        self.cancelled = False
        self.duration = 0.0
        #: Init (or, if init was killed, the zygote) wrote ``D``: the namespace is empty.
        self.namespace_empty = False
        #: ``[held, limit]`` in bytes if the memory watch stopped the call (``_bounds``).
        self.memory_stopped: list[int] | None = None
        #: The turn's memory group's OOM kills when the call started, and how many more
        #: there were by its end (``_bounds.oom_kills``; the kernel stopped the call).
        self.oom_mark: int | None = None
        self.oom_killed = 0
        #: The memory group's limit in bytes when the call ended, if the kernel stopped it.
        self.oom_limit: int | None = None
        #: ``[held, limit]`` if the watch saw the call's tasks at ``RLIMIT_NPROC``.
        self.processes_reached: list[int] | None = None
        #: Whether the workspace was full when the call started (``_bounds.disk_full``),
        #: and ``[used, size]`` if it was not and is at the call's end: the call filled it.
        self.disk_full_before = False
        self.disk_full: list[int] | None = None

    def take(self, chunk: bytes, stream: str = "stdout") -> bytes:
        """Count ``chunk``; return the part to stream (``output_chars`` characters in all,
        or for an exec ``output_bytes`` bytes of each stream)."""
        if self.split:
            room = max(0, self.output_bytes - self.kept_bytes[stream])
            self.kept_bytes[stream] += min(room, len(chunk))
            self.dropped_bytes[stream] += max(0, len(chunk) - room)
            return chunk[:room]
        if self.cut:
            self.dropped_chars += _protocol.count_chars(chunk)
            return b""
        index = _protocol.split_chars(chunk, self.output_chars - self.kept_chars)
        keep = chunk[:index]
        self.kept_chars += _protocol.count_chars(keep)
        if index < len(chunk):
            self.cut = True
            self.dropped_chars += _protocol.count_chars(chunk[index:])
        return keep


def exit_frame(call: Call, exit_code: int | None, **extra: Any) -> dict[str, Any]:
    """The ``exit`` frame that answers ``call``: what every kind carries, what its kind
    adds (``EXIT_FIELDS``), then ``extra`` (a tool call's files, or what a detached
    command's own exit says in place of the call's state)."""
    frame: dict[str, Any] = {
        "type": "exit",
        "id": call.id,
        "exit_code": exit_code,
        "timed_out": call.timed_out,
        "cancelled": call.cancelled,
        "duration": call.duration,
    }
    for key, attribute in EXIT_FIELDS[call.kind]:
        frame[key] = getattr(call, attribute)
    frame.update(extra)
    return frame


def status_values(text: bytes, letter: str) -> list[str]:
    """What a chain's status pipe said in its lines marked ``letter``, in order: ``P`` init's
    pid (from the zygote), ``X`` the command's wait status, ``E`` why the call could not
    start (from init). ``D`` alone on a line says the namespace is empty."""
    lines = text.decode("utf-8", "replace").splitlines()
    return [line[1:] for line in lines if line.startswith(letter)]


def outcome(call: Call, status: int) -> tuple[str | None, int | None]:
    """How ``call`` ended, once all its processes are gone: why it failed (for the host's
    error frame), or its exit code (None if the server stopped it). ``status`` is the wait
    status of its reaped child (a group call's)."""
    text = call.spawned.status_text
    errors = status_values(text, "E")
    if errors:
        return errors[0].strip(), None
    if call.timed_out or call.cancelled or call.memory_stopped is not None:
        return None, None
    if call.spawned.group:
        return None, _launch.exit_code_of(status)
    statuses = status_values(text, "X")
    if not statuses and call.oom_killed:
        return None, None  # the kernel's OOM killer took init itself: stopped, not failed
    if not statuses:
        return (
            "the call's pid 1 died before its command's exit "
            "(was it killed from outside the sandbox?)"
        ), None
    return None, _launch.exit_code_of(int(statuses[0]))


def refusal(order: RunOrder, chains: bool, detached: int) -> str | None:
    """Why a request may not start (a ``DETACH_*`` reason of ``_protocol``), with
    ``detached`` detached processes in the turn, or None. ``chains``: the server gives
    each call its own namespaces."""
    if not order.detach:
        return None
    if not chains:
        # Without a namespace of its own, a daemon it forks escapes the kill at close.
        return _protocol.DETACH_NEEDS_NAMESPACES
    if detached >= _protocol.DETACHED_PER_TURN:
        return _protocol.DETACH_TURN_FULL
    return None


def parse_run(message: Run, body: bytes, workdir: str) -> RunOrder:
    """The order a run request gives: argv (from the body's first ``argv_bytes``, or the
    header's list), cwd, bounds, env and stdin; raise on what its fields' types allow but
    a call cannot take."""
    argv = message.argv
    if message.argv_bytes is not None:
        size = message.argv_bytes
        if not 0 <= size <= len(body):
            raise ValueError("'argv_bytes' must count bytes of the body")
        argv = [part.decode("utf-8", "surrogateescape") for part in body[:size].split(b"\0")]
        body = body[size:]
    if not argv:
        raise TypeError("'argv' must be a non-empty list of strings")
    cwd = message.cwd or workdir
    if any("\0" in a for a in argv) or "\0" in cwd:
        raise ValueError("'argv' and 'cwd' may not contain NUL characters")
    env = message.env or {}
    if not all(k and "=" not in k and "\0" not in k + v for k, v in env.items()):
        raise ValueError("'env' must map names (no '=', no NUL) to strings without NUL")
    if message.detach and message.split:
        raise ValueError("a detached process has one merged log, not split streams")
    identity = _parse_identity(message.user)
    return RunOrder(
        argv,
        cwd,
        float(message.timeout),
        message.output_chars,
        body,
        message.split,
        message.output_bytes,
        dict(env),
        message.detach,
        identity,
    )


def _parse_identity(value: object) -> tuple[int, int] | None:
    """An exec's ``user``: ``[uid, gid]`` as the host resolved them, or None (absent)."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int and 0 <= v <= _MAX_ID for v in value)
    ):
        raise ValueError(f"'user' must be [uid, gid], each 0 to {_MAX_ID}")
    return (value[0], value[1])
