"""Whether this host's cgroup v1 hierarchies make every move between groups wait (pure).

Moving a whole process between cgroups (a pid written to ``cgroup.procs``, as
Docker's runc does for each container) takes the kernel's one
``cgroup_threadgroup_rwsem`` for writing. Unless some hierarchy is mounted
with ``favordynmods`` (Linux 6.0+, on cgroup v1 and v2 alike), that lock keeps
its readers (every fork and exit) cheap and can make a writer wait for an RCU
grace period first, a cost that grows with the host's load. Mounting one
hierarchy with it turns that around for the whole kernel: moves stop waiting,
forks and exits pay a little more. Our own turn groups avoid the cost either
way (``_cgroup`` writes ``tasks``), so this is only ``astralvessel doctor``'s hint.
"""

from __future__ import annotations

__all__ = ["OPTION", "favordynmods_hint"]

#: The mount option, in the super options of a cgroup line of /proc/self/mountinfo.
OPTION = "favordynmods"


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, list[str]]]:
    """(mount point, file system type, super options) of each cgroup v1 or v2 mount."""
    found = []
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], tail[0], tail[2].split(",")))
    return found


def favordynmods_hint(mountinfo: str) -> str | None:
    """The hint line for a host with cgroup v1 mounted and no hierarchy with ``favordynmods``
    (``mountinfo`` is /proc/self/mountinfo's text); None when there is nothing to say."""
    mounts = _cgroup_mounts(mountinfo)
    v1 = [point for point, kind, _ in mounts if kind == "cgroup"]
    if not v1 or any(OPTION in options for _, _, options in mounts):
        return None
    return (
        f"cgroup v1 is mounted ({v1[0]}, ...) and no cgroup hierarchy with {OPTION}: each "
        "process moved between groups (runc, for every Docker container) can wait for an RCU "
        f"grace period under a kernel-wide lock. Mounting one with {OPTION} (Linux 6.0+; "
        f"`mount -t cgroup -o none,name={OPTION},{OPTION} cgroup DIR` will do) removes that "
        "wait for every writer, and makes forks and exits a little dearer"
    )
