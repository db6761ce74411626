"""A turn's cgroups on the host, made by us: memory (bubblewrap), memory and pids (nsjail).

Where we are root and cgroup v1's controllers are mounted, each turn gets
``<controller mount>/astralvessel/turn-<host pid>-<token>`` per controller,
bounded from the policy's limits (``BOUNDS``): ``memory.limit_in_bytes`` of
``memory_mb + disk_mb + SERVER_MEMORY_MB`` (the workspace's tmpfs pages and the
server are charged too), ``pids.max`` of ``processes + SERVER_PIDS``, and
where the kernel has it ``memory.kmem.tcp.limit_in_bytes`` of ``memory_mb``
(``KERNEL_BOUNDS``: v1 keeps TCP buffers in a counter of their own). The tool
is started through ``/bin/sh`` writing ``0`` (itself) to each group's
``tasks`` and then ``exec``-ing it, so every process of the sandbox is born
inside the groups; moving the tool after it started would race its first
fork. ``tasks``, not ``cgroup.procs``: the shell is one thread, so moving that
thread moves the process, and the kernel moves the writer's own thread without
its global write lock on every thread group (``cgroup_threadgroup_rwsem``),
whose taking waits out an RCU grace period: 5-15 ms of every turn's start on a
2-core host, against 0.1-0.5 ms.

The groups are named after the host process that owns the turn, which lives
as long as the turn's sandbox (the sandbox dies with it), never after a
process inside the sandbox: a sweep that judged a group by the sandbox's own
processes could remove it in the moment between that process's exit and the
tool's own cleanup, or between a reused pid's group being made and filled.
nsjail's own cgroup options name their groups that way (``NSJAIL.<jailed
pid>``), and concurrent turns' sweeps raced nsjail's ``rmdir``; so nsjail,
too, starts inside groups of ours and its options stay unused.

An ordinary user cannot create v1 groups, and cgroup v2 delegation differs
from host to host (a systemd user scope, a container's own subtree), so
neither is attempted: there the server's memory watch and ``RLIMIT_AS`` are
the bound (see ``docs/sandbox-server.md``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

import attrs

from ._hostinfo import HostFacts
from ._policy import Limits

__all__ = [
    "BOUNDS",
    "KERNEL_BOUNDS",
    "SERVER_MEMORY_MB",
    "SERVER_PIDS",
    "TurnCgroup",
    "cgroup_mounts",
    "memory_mount",
    "memory_note",
    "oom_kills",
    "sweep_dead",
    "turn_cgroup",
    "turn_memory_bytes",
    "turn_pids",
    "turn_tcp_bytes",
]

#: The folder under each controller's mount that holds every turn's group.
PARENT = "astralvessel"
#: The prefix of a turn's group's name; the host pid that owns it follows.
PREFIX = "turn-"
#: Every name a group under ``PARENT`` may have, each followed by the pid it dies with:
#: ours, and ``NSJAIL.<jailed pid>``, which nsjail made there while older versions of this
#: library used its cgroup options, and left behind whenever a turn's close killed nsjail.
SWEPT_PREFIXES = (PREFIX, "NSJAIL.")
#: Headroom for the server itself on top of the calls' memory and workspace, in MiB.
SERVER_MEMORY_MB = 128
#: Processes and threads the server (and the tool that starts it) needs beside the calls' own.
SERVER_PIDS = 32
#: How long ``remove`` waits for a killed sandbox's last processes to leave its groups, in s.
REMOVE_WAIT = 5.0
#: Groups this process could not remove at close (a process still exiting); retried later.
_LEFTOVERS: set[str] = set()


def turn_memory_bytes(limits: Limits) -> int:
    """The whole turn's memory bound: calls, workspace and server."""
    return (limits.memory_mb + limits.disk_mb + SERVER_MEMORY_MB) << 20


def turn_pids(limits: Limits) -> int:
    """The whole turn's bound on processes and threads: the calls' and the server's."""
    return limits.processes + SERVER_PIDS


#: Each controller a turn's group can have: the file that bounds it, and the bound.
BOUNDS: Mapping[str, tuple[str, Callable[[Limits], int]]] = {
    "memory": ("memory.limit_in_bytes", turn_memory_bytes),
    "pids": ("pids.max", turn_pids),
}


def turn_tcp_bytes(limits: Limits) -> int:
    """The turn's bound on TCP socket buffers, which cgroup v1 charges apart from its memory."""
    return limits.memory_mb << 20


#: Bounds written where the kernel has the file: v1 charges TCP buffers to no group until
#: one is set (a call of a turn of memory_mb=64 held 364 MiB of loopback buffers, 63 with
#: it), and a kernel without kmem accounting has no such file.
KERNEL_BOUNDS: Mapping[str, tuple[tuple[str, Callable[[Limits], int]], ...]] = {
    "memory": (("memory.kmem.tcp.limit_in_bytes", turn_tcp_bytes),),
}


def cgroup_mounts(facts: HostFacts, controllers: Sequence[str]) -> dict[str, str] | None:
    """Where each of ``controllers`` is mounted (cgroup v1, as root), or ``None`` if one is not."""
    mounts = {name: facts.cgroup_v1.get(name, "") for name in controllers}
    return mounts if facts.is_root and all(mounts.values()) else None


def memory_mount(facts: HostFacts) -> str | None:
    """Where a turn's memory group can be made here (cgroup v1, as root), or ``None``."""
    mounts = cgroup_mounts(facts, ("memory",))
    return None if mounts is None else mounts["memory"]


def _paths(instance: object, attribute: object, value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not value:
        raise ValueError(f"a turn's cgroup needs a tuple of one or more paths, not {value!r}")
    if not all(isinstance(path, str) and os.path.isabs(path) for path in value):
        raise ValueError(f"a turn's cgroup's paths must be absolute, not {value!r}")


@attrs.frozen
class TurnCgroup:
    """A turn's groups, one per controller: ``wrap`` starts a command in them."""

    paths: tuple[str, ...] = attrs.field(validator=_paths)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started inside the groups: the shell enters each, then becomes ``argv``."""
        # The shell's only thread, so the shell (see the module's docstring for why not procs).
        procs = [os.path.join(path, "tasks") for path in self.paths]
        # "$0" is the first group's file, then "$1".. the others, shifted away before the exec.
        enter = " && ".join(['echo 0 >"$0"'] + ['echo 0 >"$1" && shift'] * (len(procs) - 1))
        return ["/bin/sh", "-c", enter + ' && exec "$@"', *procs, *argv]

    def open_memory_events(self) -> int | None:
        """A read-only descriptor of the memory group's ``memory.oom_control``, for the server
        to count the kernel's OOM kills in the turn (``None`` without a memory group)."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                return os.open(os.path.join(path, "memory.oom_control"), os.O_RDONLY)
        return None

    def open_memory_limit(self) -> int | None:
        """A read-only descriptor of the memory group's ``memory.stat``, whose
        ``hierarchical_memory_limit`` is the bound the kernel applies, for the server's
        note on a call it stopped (``None`` without a memory group)."""
        for path in self.paths:
            with contextlib.suppress(OSError):
                return os.open(os.path.join(path, "memory.stat"), os.O_RDONLY)
        return None

    def widen_memory(self, extra: int) -> None:
        """Raise the memory group's bound by ``extra`` bytes (none without a memory group).

        Raises ``OSError`` where the bound cannot be read or written.
        """
        for path in self.paths:
            limit = os.path.join(path, "memory.limit_in_bytes")
            if not os.path.exists(limit):
                continue
            with open(limit, "rb") as handle:
                current = int(handle.read())
            with open(limit, "wb") as handle:
                handle.write(str(current + max(0, extra)).encode())

    def memory_note(self) -> str:
        """Why the kernel stopped this turn's processes, for a sandbox that died; else ``""``.

        cgroup v1 counts the OOM killer's kills in the group (``oom_kill`` of
        ``memory.oom_control``, Linux 4.13+); read before ``remove``.
        """
        for path in self.paths:
            try:
                with open(os.path.join(path, "memory.oom_control"), "rb") as handle:
                    kills = oom_kills(handle.read())
                with open(os.path.join(path, "memory.limit_in_bytes"), "rb") as handle:
                    limit = int(handle.read()) >> 20
            except (OSError, ValueError):
                continue
            if kills:
                return memory_note(kills, limit)
        return ""

    def remove(self) -> None:
        """Delete the groups once their processes are gone (a moment after the sandbox is killed).

        The tool is reaped when this runs, but the processes it leaves (a killed
        nsjail's jail, torn down by the kernel) may take a moment to exit; a group
        still busy after ``REMOVE_WAIT`` is kept for a later turn's sweep.
        """
        deadline = time.monotonic() + REMOVE_WAIT
        pause = 0.001
        for path in self.paths:
            while True:
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        _LEFTOVERS.add(path)
                        break
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
                else:
                    break


def oom_kills(text: bytes) -> int:
    """The ``oom_kill`` count in a memory group's ``memory.oom_control`` or ``memory.events``."""
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def memory_note(kills: int, limit_mb: int) -> str:
    """What a result says when the kernel's OOM killer stopped ``kills`` processes of a turn."""
    return (
        f"killed for using more memory than its limit: the kernel stopped {kills} "
        f"process{'es' if kills != 1 else ''} of the turn when it held its whole {limit_mb} MiB "
        "(the calls' memory, the workspace's files, the server and kernel buffers such as pipes)"
    )


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it holds no group)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold any byte.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def sweep_dead(parent: str, prefix: str = PREFIX) -> None:
    """Remove the groups ``<prefix><pid>-...`` under ``parent`` whose owning host process is gone.

    The owner lives as long as its turns' sandboxes, so a live turn's group is
    never judged dead; a busy group is kept anyway (``rmdir`` refuses it). An
    old ``NSJAIL.<pid>`` group goes the same way: its pid was the jailed process,
    which lives as long as anything nsjail put in the group, and while nsjail
    still sets a group up (mkdir, then its pid) that process is alive.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        owner = name[len(prefix) :].partition("-")[0]
        if name.startswith(prefix) and owner.isdigit() and not _alive(int(owner)):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))


def _sweep(parents: Sequence[str]) -> None:
    """Remove this process's leftover groups, and those of host processes that died."""
    for path in list(_LEFTOVERS):
        with contextlib.suppress(OSError):
            os.rmdir(path)
        if not os.path.isdir(path):
            _LEFTOVERS.discard(path)
    for parent in parents:
        for prefix in SWEPT_PREFIXES:
            sweep_dead(parent, prefix)


def turn_cgroup(mounts: Mapping[str, str], limits: Limits) -> TurnCgroup:
    """Make a new turn's group under each controller's mount; raise ``OSError`` if the host refuses.

    ``mounts`` maps each controller of ``BOUNDS`` the turn gets to its mount.
    """
    parents = [os.path.join(mount, PARENT) for mount in mounts.values()]
    for parent in parents:
        os.makedirs(parent, exist_ok=True)
    _sweep(parents)
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    made: list[str] = []
    try:
        for controller, mount in mounts.items():
            limit_file, bound = BOUNDS[controller]
            path = os.path.join(mount, PARENT, name)
            os.mkdir(path)
            made.append(path)
            with open(os.path.join(path, limit_file), "w", encoding="ascii") as handle:
                handle.write(str(bound(limits)))
            for kernel_file, kernel_bound in KERNEL_BOUNDS.get(controller, ()):
                if os.path.exists(os.path.join(path, kernel_file)):
                    with open(os.path.join(path, kernel_file), "w", encoding="ascii") as handle:
                        handle.write(str(kernel_bound(limits)))
    except BaseException:
        if made:
            TurnCgroup(tuple(made)).remove()
        raise
    return TurnCgroup(tuple(made))
