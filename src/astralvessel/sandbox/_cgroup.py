"""A turn's memory cgroup on the host, for a backend whose tool has no cgroup option (bubblewrap).

Where we are root and cgroup v1's ``memory`` controller is mounted, each turn
gets ``<memory mount>/astralvessel/turn-<pid>-<token>`` with
``memory.limit_in_bytes`` of ``memory_mb + disk_mb + SERVER_MEMORY_MB`` (the
workspace's tmpfs pages and the server are charged too), as nsjail's own
cgroup. The tool is started through ``/bin/sh`` writing ``0`` (itself) to the
group's ``cgroup.procs`` and then ``exec``-ing it, so every process of the
sandbox is born inside the group; moving the tool after it started would race
its first fork.

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
from collections.abc import Sequence

import attrs

from ._hostinfo import HostFacts
from ._policy import Limits

__all__ = [
    "SERVER_MEMORY_MB",
    "TurnCgroup",
    "memory_mount",
    "sweep_dead",
    "turn_cgroup",
    "turn_memory_bytes",
]

#: The folder under the memory controller's mount that holds every turn's group.
PARENT = "astralvessel"
#: Headroom for the server itself on top of the calls' memory and workspace, in MiB.
SERVER_MEMORY_MB = 128
#: Groups this process could not remove at close (a process still exiting); retried later.
_LEFTOVERS: set[str] = set()


def memory_mount(facts: HostFacts) -> str | None:
    """Where a turn's memory group can be made here (cgroup v1, as root), or ``None``."""
    mount = facts.cgroup_v1.get("memory")
    return mount if facts.is_root and mount else None


def turn_memory_bytes(limits: Limits) -> int:
    """The whole turn's memory bound: calls, workspace and server."""
    return (limits.memory_mb + limits.disk_mb + SERVER_MEMORY_MB) << 20


@attrs.frozen
class TurnCgroup:
    """One turn's memory group; ``wrap`` starts a command in it, ``remove`` deletes it."""

    path: str

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started inside the group: the shell enters it, then becomes ``argv``."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["/bin/sh", "-c", 'echo 0 >"$0" && exec "$@"', procs, *argv]

    def remove(self) -> None:
        """Delete the group once its processes are gone (a moment after the sandbox is killed)."""
        for _ in range(20):
            try:
                os.rmdir(self.path)
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)
            else:
                return
        _LEFTOVERS.add(self.path)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has: it holds no group)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold any byte.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def sweep_dead(parent: str, prefix: str) -> None:
    """Remove the groups ``<prefix><pid>...`` under ``parent`` whose process is gone.

    Ours are ``turn-<host pid>-<token>``; nsjail's are ``NSJAIL.<jailed pid>``,
    which nsjail removes only when it exits on its own, never when a turn's
    close kills it. An empty group is removed, a busy one kept.
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


def _sweep(parent: str) -> None:
    """Remove this process's leftover groups, and those of host processes that died."""
    for path in list(_LEFTOVERS):
        with contextlib.suppress(OSError):
            os.rmdir(path)
        if not os.path.isdir(path):
            _LEFTOVERS.discard(path)
    sweep_dead(parent, "turn-")


def turn_cgroup(mount: str, limits: Limits) -> TurnCgroup:
    """Make a new turn's memory group under ``mount``; raise ``OSError`` if the host refuses."""
    parent = os.path.join(mount, PARENT)
    os.makedirs(parent, exist_ok=True)
    _sweep(parent)
    path = os.path.join(parent, f"turn-{os.getpid()}-{secrets.token_hex(6)}")
    os.mkdir(path)
    group = TurnCgroup(path)
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w", encoding="ascii") as handle:
            handle.write(str(turn_memory_bytes(limits)))
    except OSError:
        group.remove()
        raise
    return group
