"""Which mechanism holds each limit on this host, per backend: what ``doctor`` prints.

Pure functions over what a backend found (is there a memory or pids cgroup
for the turn, does a sandbox server run the calls); one table row per limit,
so a backend that changes a mechanism changes one cell.
"""

from __future__ import annotations

import attrs

from ._cgroup import SERVER_MEMORY_MB

__all__ = ["LIMITS", "Setup", "limit_mechanisms"]

_WATCH = "the server's memory watch (all the turn's calls together, sampled every 50 ms)"
_NPROC = "RLIMIT_NPROC per call, counted in the call's own user namespace"


@attrs.frozen(kw_only=True)
class Setup:
    """What a backend's turns have here, as far as the limits go."""

    #: ``"cgroup v1"``, ``"cgroup v2"`` or ``""``: the turn's memory cgroup, if any.
    memory_cgroup: str = ""
    #: The same for a pids cgroup.
    pids_cgroup: str = ""
    #: Whether the sandbox server runs the calls (every backend but docker-exec).
    server: bool = True
    #: Why there is no memory cgroup, when there is none.
    no_cgroup: str = ""
    #: Whether the turn's v1 memory group also bounds TCP buffers (``memory.kmem.tcp``).
    tcp_cgroup: bool = False


def _memory(setup: Setup) -> str:
    parts = []
    if setup.memory_cgroup:
        parts.append(
            f"a {setup.memory_cgroup} memory group for the turn "
            f"(memory_mb + disk_mb + {SERVER_MEMORY_MB} MiB, kernel-enforced)"
        )
    if setup.server:
        parts.append(_WATCH)
    parts.append("RLIMIT_AS per process")
    text = "; ".join(parts)
    if not setup.memory_cgroup and setup.no_cgroup:
        text += f" (no memory cgroup: {setup.no_cgroup})"
    return text


def _kernel_memory(setup: Setup) -> str:
    parts = []
    if setup.server:
        parts.append(
            "socket buffers, epoll watches and pipes counted by the memory watch (memory_mb)"
        )
    if setup.memory_cgroup:
        tcp = (
            "TCP buffers up to memory_mb apart (memory.kmem.tcp)"
            if setup.tcp_cgroup or setup.memory_cgroup == "cgroup v2"
            else "not TCP buffers"
        )
        parts.append(f"the turn's {setup.memory_cgroup} memory group, {tcp}")
    parts.append("RLIMIT_SIGPENDING 1024 per call")
    return "; ".join(parts)


def _processes(setup: Setup) -> str:
    parts = [f"a {setup.pids_cgroup} pids group for the turn"] if setup.pids_cgroup else []
    parts.append(
        _NPROC
        if setup.server
        else "RLIMIT_NPROC per call (ulimit -p), counted per the turn's own host uid"
    )
    return "; ".join(parts)


#: Each limit's row: its name and how to describe its mechanism for a ``Setup``.
LIMITS = (
    ("memory", _memory),
    ("disk", lambda setup: "the workspace tmpfs's size= (disk_mb); RLIMIT_FSIZE per process"),
    ("inodes", lambda setup: "the workspace tmpfs's nr_inodes= (one per 2 KiB of disk_mb)"),
    ("processes", _processes),
    ("open files", lambda setup: "RLIMIT_NOFILE per process"),
    ("kernel memory", _kernel_memory),
)


def limit_mechanisms(setup: Setup) -> dict[str, str]:
    """Each limit's mechanism for turns set up as ``setup``, in ``LIMITS`` order."""
    return {name: describe(setup) for name, describe in LIMITS}
