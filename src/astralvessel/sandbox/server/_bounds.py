"""Bounds the server keeps for the whole turn, not per call (stdlib only, Python 3.8+).

``bound_inodes`` caps how many entries the workspace tmpfs holds. nsjail and
Docker mount it with ``nr_inodes`` already; bubblewrap has no option for it, so
the server, which holds ``CAP_SYS_ADMIN`` over the sandbox's mount namespace,
remounts the tmpfs with the bound before any call runs. Without it, empty
files cost nothing of the ``size`` bound while each pins about 1.4 KiB of host
kernel memory (inode and dentry).
"""

from __future__ import annotations

import errno
import os

from . import _kernelmem, _sys

# mypy reads any ``if TYPE_CHECKING:`` block as taken; the server never imports typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "MEMORY_INTERVAL",
    "bound_inodes",
    "call_memory",
    "disk_full",
    "group_limit",
    "limit_reader",
    "oom_counter",
    "oom_kills",
    "over_limit",
    "processes_reached",
    "victim",
]

_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> the mount flags that keep them: a remount resets every per-mount
# flag it is not given (losing nosuid would be worse than no inode bound), and in a user
# namespace the kernel refuses to clear a flag it locked.
_KEEP = (
    (os.ST_RDONLY, _sys.MS_RDONLY),
    (os.ST_NOSUID, _sys.MS_NOSUID),
    (os.ST_NODEV, _sys.MS_NODEV),
    (os.ST_NOEXEC, _sys.MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)


def bound_inodes(path: str, inodes: int) -> str:
    """Hold the tmpfs at ``path`` to at most ``inodes`` entries; return why not, or ``""``."""
    try:
        before = os.statvfs(path)
        if 0 < before.f_files <= inodes:
            return ""  # the backend mounted it bounded (nsjail, Docker)
        flags = _sys.MS_REMOUNT
        for st_flag, ms_flag in _KEEP:
            if before.f_flag & st_flag:
                flags |= ms_flag
        _sys.mount(None, path, None, flags, f"nr_inodes={inodes}")
        after = os.statvfs(path)
    except OSError as exc:
        return f"cannot bound the inodes of {path}: {exc}"
    lost = before.f_flag & ~after.f_flag & (os.ST_RDONLY | os.ST_NOSUID | os.ST_NODEV)
    if lost or not 0 < after.f_files <= inodes:
        return (
            f"remounting {path} left {after.f_files} inodes (wanted {inodes}), "
            f"flags {after.f_flag:#x} of {before.f_flag:#x}"
        )
    return ""


# -- the turn's memory ---------------------------------------------------------------------

#: How often the server samples its calls' memory while any runs, in seconds.
MEMORY_INTERVAL = 0.05
#: ... or this many times what the last sample took, if longer.
MEMORY_BACKOFF = 10
_KIB = 1024
_PAGE = 512  # st_blocks unit


def _read(path: str) -> str:
    # Bytes, decoded by the C fast path: a text-mode open imports its codec on the first
    # memory sample, and an import after the zygote's fork copies pages all over the
    # interpreter (about 1 MiB of every turn that has served a call).
    with open(path, "rb") as handle:
        return handle.read().decode("ascii", "replace")


def _fields(text: str, names: tuple[str, ...]) -> dict[str, int]:
    """``Name:  123 kB`` lines of a /proc file, the first number of each named one."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            parts = rest.split()
            found[name] = int(parts[0]) if parts and parts[0].isdigit() else 0
    return found


def _status(pid: str) -> tuple[list[int], int, int, int, int]:
    """``pid``'s pids from this namespace down (``NSpid``), its parent's pid here, its RSS,
    the slots of its descriptor table (``FDSize``: every descriptor it holds is below)
    and its threads (``Threads``: each is a task ``RLIMIT_NPROC`` counts).

    The RSS is its resident anonymous and shared memory (``RssAnon + RssShmem``),
    in bytes: kernel counters, so reading them costs the same whatever the size.
    """
    nspid: list[int] = []
    ppid = rss = slots = 0
    threads = 1
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("NSpid:"):
            nspid = [int(p) for p in line.split()[1:]]
        elif line.startswith("PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(("RssAnon:", "RssShmem:")):
            rss += int(line.split()[1]) * _KIB
        elif line.startswith("FDSize:"):
            slots = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return nspid, ppid, rss, slots, threads


def _pss(pid: str) -> int | None:
    """``pid``'s proportional share (PSS) of anonymous and shared memory, or None if unreadable.

    PSS splits a page among the processes that map it, so memory a fork shares
    copy-on-write counts once, not once per child. The kernel walks the
    process's page tables for it (about 17 ms for 200 MiB on a loaded small VM),
    so it is read only when the RSS says the calls may be over the limit.
    ``Pss_Anon`` needs Linux 5.8; a call's init is not dumpable and cannot be read.
    """
    try:
        pss = _fields(_read(f"/proc/{pid}/smaps_rollup"), ("Pss_Anon", "Pss_Shmem"))
    except OSError:
        return None
    if "Pss_Anon" not in pss:
        return None
    return (pss["Pss_Anon"] + pss.get("Pss_Shmem", 0)) * _KIB


#: Pages a pipe keeps cached after it is drained (Linux 6.14+; one before), whatever it holds.
_PIPE_CACHED_PAGES = 2
_PIPE_PAGE = 4096


def _pipe_bytes(path: str) -> int:
    """The most memory the pipe at ``path`` (``/proc/N/fd/M``) can pin now.

    A pipe holds each write in a page of its own ring (up to its capacity,
    ``F_GETPIPE_SZ``), merging small writes into the last page except in packet
    mode, so the pages it pins number at most its slots and at most the bytes
    it holds (``FIONREAD``), plus the pages it keeps cached. Opened anew through
    ``/proc`` (read-only, non-blocking), which the server may: it already reads
    the process's descriptors.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        capacity, held = _sys.pipe_load(fd)
    except OSError:
        return 0
    finally:
        os.close(fd)
    return _PIPE_PAGE * (min(capacity // _PIPE_PAGE, held) + _PIPE_CACHED_PAGES)


def _descriptor_bytes(path: str, seen: set[object], kernel: _kernelmem.Sample) -> int:
    """Bytes the descriptor at ``path`` (``/proc/N/fd/M``) holds if it is a memfd, a pipe
    or a socket that no earlier descriptor was charged for, or an epoll's watches; 0 for
    anything else. ``kernel.sockets`` maps each uncharged socket's inode to its bytes."""
    try:
        target = os.readlink(path)
    except OSError:
        return 0
    if target.startswith("pipe:"):
        if target in seen:  # "pipe:[inode]": one pipe, however many ends are open
            return 0
        seen.add(target)
        return _pipe_bytes(path)
    if target.startswith("socket:["):
        # Charged once: popped, so what stays in the map is held by no call's descriptor.
        inode = target[8:-1]
        return kernel.sockets.pop(int(inode), 0) if inode.isdigit() else 0
    if target == "anon_inode:[eventpoll]":
        # Every epoll shares one anonymous inode, so one shared by a fork counts per holder.
        return _kernelmem.epoll_bytes(path, kernel)
    return _memfd_bytes(path, seen) if target.startswith("/memfd:") else 0


def _memfd_bytes(path: str, seen: set[object]) -> int:
    """Bytes the memfd at ``path`` holds, unless an earlier descriptor was charged for it."""
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if (st.st_dev, st.st_ino) in seen:
        return 0
    seen.add((st.st_dev, st.st_ino))
    return st.st_blocks * _PAGE


def _descriptors(
    pid: str, seen: set[object], slots: int = 0, kernel: _kernelmem.Sample | None = None
) -> int | None:
    """Bytes of the memfd files, pipes and sockets ``pid`` holds open that no earlier
    process was charged for, and of its epoll watches; None if the server can read them
    neither way (below).

    A memfd holds memory whether or not it is mapped, and unmapped pages show in
    no process's PSS; a pipe's buffers are kernel memory that no RSS counts (a
    call filling pipes pinned hundreds of MiB unseen). The descriptors are read
    every sample anyway, so this costs a ``readlink`` each, and four system
    calls per distinct pipe. A process that is not dumpable (``PR_SET_DUMPABLE``,
    or started from a file it cannot read) has its ``/proc/PID/fd`` owned by a
    root the server is not, unless it is real root; its descriptors are then
    copied one by one (``_copied_descriptors``), ``slots`` of them at most.
    """
    kernel = _kernelmem.Sample() if kernel is None else kernel
    total = 0
    base = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(base)
    except PermissionError:
        return _copied_descriptors(pid, slots, seen, kernel)
    except OSError:
        return 0  # gone
    for fd in fds:
        total += _descriptor_bytes(f"{base}/{fd}", seen, kernel)
    return total


def _copied_descriptors(
    pid: str, slots: int, seen: set[object], kernel: _kernelmem.Sample | None = None
) -> int | None:
    """``_descriptors`` for a process whose ``/proc/PID/fd`` the server may not read: each
    of its first ``slots`` descriptors copied in with ``pidfd_getfd``, weighed, closed.

    That asks for ptrace access instead, which the server has over every call:
    each call's user namespace is a child of the server's and owned by the
    server's uid (``_userns``), so the server holds every capability in it
    without holding any more in its own; the calls' seccomp filter refuses
    ``pidfd_getfd`` and ``ptrace``. A copy holds a pipe's end open for the few
    system calls it is weighed in. None when the kernel refuses even that (a
    process started from an unreadable file the call did not make, whose memory
    then belongs to a namespace above the server's; or a kernel before 5.6).
    """
    kernel = _kernelmem.Sample() if kernel is None else kernel
    try:
        pidfd = _sys.pidfd_open(int(pid))
    except OSError as exc:
        return 0 if exc.errno == errno.ESRCH else None
    total = 0
    try:
        for number in range(slots):
            try:
                fd = _sys.pidfd_getfd(pidfd, number)
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    continue  # no descriptor there
                return total if exc.errno == errno.ESRCH else None
            try:
                total += _descriptor_bytes(f"/proc/self/fd/{fd}", seen, kernel)
            finally:
                os.close(fd)
    finally:
        os.close(pidfd)
    return total


def call_memory(
    inits: dict[int, int],
    depth: int,
    *,
    precise: bool = False,
    weighed: dict[int, int] | None = None,
    limit: int = 0,
    tasks: dict[int, int] | None = None,
) -> dict[int, int]:
    """Bytes each running call holds, by call id: every process of its PID namespace.

    ``inits`` maps each call's init, by its pid in the zygote's namespace (the
    ``P`` line), to the call's id; a call's processes are ``depth`` namespaces
    deep as this ``/proc`` counts them (``Zygote.call_depth``). Every process of
    a call's namespace descends from its init (orphans are re-parented to it),
    so each is charged to the init its parents lead to. That takes only
    ``status``, which needs no ptrace access (init is not dumpable). Each
    process counts its RSS, or with ``precise`` its PSS where the kernel has it
    (never more than the RSS), plus the memfd files, pipes and sockets it holds open and
    its epoll watches (``_kernelmem``); buffers of sockets no call holds count to the
    largest call. A process
    that exits while it is read is skipped. A process whose descriptors the server can
    read neither way (``_descriptors``) counts without them: stopping its call for that
    stopped honest calls, since a process is unreadable for a moment between a change of
    uid and its exec, and Docker's default seccomp profile refuses ``pidfd_getfd``.
    ``weighed`` keeps each process's descriptors' bytes: a second pass given the first's
    map reuses them (reading a million epoll watches' ``fdinfo`` takes seconds under load).
    ``limit`` weighs epoll watches (``_kernelmem.Sample``) and bounds how many are read.
    ``tasks``, if given, gets each call's tasks (its processes' threads, init's included).
    """
    usage = dict.fromkeys(inits.values(), 0)
    parent: dict[int, int] = {}
    resident: dict[int, int] = {}
    slots: dict[int, int] = {}
    threads: dict[int, int] = {}
    owner: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            nspid, ppid, rss, fd_slots, threads[int(name)] = _status(name)
        except (OSError, ValueError, IndexError):
            continue
        if len(nspid) < depth:
            continue  # not in a call's namespace (the server, the zygote, the worker)
        parent[int(name)] = ppid
        resident[int(name)] = rss
        slots[int(name)] = fd_slots
        if len(nspid) == depth and nspid[-1] == 1 and nspid[-2] in inits:
            # A call's init: pid 1 of its namespace; one level up, the zygote's P line.
            owner[int(name)] = inits[nspid[-2]]
    seen: set[object] = set()
    weighed = {} if weighed is None else weighed
    counted = {} if tasks is None else tasks
    reuse = _UNHELD in weighed
    kernel = _kernelmem.Sample({} if reuse else _calls_sockets(), limit)
    for pid in parent:
        walk, steps = pid, 0
        while walk not in owner and walk in parent and steps < len(parent):
            walk, steps = parent[walk], steps + 1
        call = owner.get(walk)
        if call is None:
            continue
        counted[call] = counted.get(call, 0) + threads[pid]
        held = _pss(str(pid)) if precise else resident[pid]
        if held is None:
            # Unreadable, or exiting (its mm already gone): its RSS now, not the one read above.
            try:
                held = _status(str(pid))[2]
            except (OSError, ValueError, IndexError):
                held = 0
        if not reuse:
            weighed[pid] = _descriptors(str(pid), seen, slots[pid], kernel) or 0
        usage[call] += held + weighed.get(pid, 0)
    weighed.setdefault(_UNHELD, sum(kernel.sockets.values()))
    if usage:
        # Buffers of sockets no call's descriptor names (in flight inside a unix message,
        # TCP's orphans, the relay's side of a call's connection): the largest call's.
        usage[max(usage, key=lambda call: (usage[call], -call))] += weighed[_UNHELD]
    return usage


#: ``weighed``'s key for the buffers of sockets no call holds: pid 0 is no process's.
_UNHELD = 0


def _calls_sockets() -> dict[int, int]:
    """Each socket's buffers in the sandbox but the server's own, by inode."""
    sockets = _kernelmem.socket_buffers() or {}
    _forget_own_sockets(sockets)
    return sockets


def _forget_own_sockets(sockets: dict[int, int]) -> None:
    """Take the server's own sockets (its channel to the host, its zygote's) out of
    ``sockets``: what they hold is the host's requests, not a call's."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1].isdigit():
            sockets.pop(int(target[8:-1]), None)


def over_limit(usage: dict[int, int], limit: int) -> int | None:
    """The call to stop when the calls together hold more than ``limit``: the largest."""
    if sum(usage.values()) <= limit or not usage:
        return None
    return max(usage, key=lambda call: (usage[call], -call))


def victim(
    inits: dict[int, int], depth: int, limit: int, tasks: dict[int, int] | None = None
) -> tuple[int, list[int]] | None:
    """The call to stop, and ``[held, limit]`` in bytes, when the calls whose inits are
    ``inits`` (init's pid: call id) hold more than ``limit`` together; None if they do not.
    ``tasks`` gets each call's tasks (``call_memory``)."""
    weighed: dict[int, int] = {}
    usage = call_memory(inits, depth, weighed=weighed, limit=limit, tasks=tasks)
    if over_limit(usage, limit) is not None:
        # The RSS counts pages a fork shares once per process; decide on the PSS (the
        # descriptors as weighed a moment ago).
        usage = call_memory(inits, depth, precise=True, weighed=weighed)
    chosen = over_limit(usage, limit)
    return None if chosen is None else (chosen, [sum(usage.values()), limit])


# -- the calls' processes and the workspace's disk ------------------------------------------


def processes_reached(tasks: dict[int, int], processes: int) -> dict[int, list[int]]:
    """``[held, processes]`` for each call whose tasks (``call_memory``: init's included)
    reach its ``RLIMIT_NPROC``, which init sets to ``processes`` plus itself.

    The limit counts the tasks of the call's uid in the call's own user namespace
    (Linux 5.14+), which are exactly its namespace's: at the limit, the kernel
    refuses every fork and thread of the call with ``EAGAIN``, so this is the
    bound stopping it, whatever the command then does. The count is the watch's
    (``MEMORY_INTERVAL``): a call that stays below its limit is never reported,
    and one that touches it only between two samples is missed.
    """
    return {call: [held - 1, processes] for call, held in tasks.items() if held >= processes + 1}


def disk_full(path: str) -> list[int] | None:
    """``[used, size]`` in bytes when the tmpfs at ``path`` has no block or no inode left;
    None if it has both, or cannot be read.

    A tmpfs allocates whole pages, so a write it cannot hold leaves it with no
    free block (``ENOSPC``, after writing what fit), and a file it cannot create
    leaves no free inode: the state itself says the bound was met, unlike an exit
    code. One ``statvfs``: cheap enough for every call's start and end.
    """
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    # A bound of 0 is none (size=0, nr_inodes=0): such a count is never full.
    blocks_left = st.f_blocks == 0 or st.f_bfree > 0
    inodes_left = st.f_files == 0 or st.f_ffree > 0
    if blocks_left and inodes_left:
        return None
    return [(st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize]


# -- the turn's memory group ----------------------------------------------------------------


def oom_counter(paths: list[str]) -> int | None:
    """A descriptor of the first of ``paths`` that opens: a file of the turn's memory group
    that counts the kernel's OOM kills (``oom_kill``); None where the turn has none.

    The host names them (``memory_events`` in the hello): a descriptor it passed in
    (``/proc/self/fd/N``, bubblewrap and nsjail as root) or the container's own group
    (Docker). Calls never hold it: every child closes what it did not ask for.
    """
    return _first_readable(paths, oom_kills)


def _first_readable(paths: list[str], read: Callable[[int], int | None]) -> int | None:
    """A descriptor of the first of ``paths`` that opens and that ``read`` finds a value in."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if read(fd) is not None:
            return fd
        os.close(fd)
    return None


def oom_kills(fd: int) -> int | None:
    """How many processes the kernel's OOM killer has stopped in the group, or None if unreadable.

    One ``pread`` of a few dozen bytes: cheap enough for every call's start and end.
    """
    try:
        text = os.pread(fd, 4096, 0)
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"oom_kill" and value.strip().isdigit():
            return int(value)
    return None


#: A limit at or above this is the kernel's "no limit" (v1 writes it as a huge page count).
_UNLIMITED = 1 << 62


def limit_reader(paths: list[str]) -> int | None:
    """A descriptor of the first of ``paths`` that opens and holds a limit (``group_limit``);
    None where the turn has no memory group, or its limit cannot be read.

    The host names them (``memory_limits`` in the hello), as it names the OOM counter:
    v1's ``memory.stat``, whose ``hierarchical_memory_limit`` is the bound the kernel
    applies (the group's own or a lower one above it), or v2's ``memory.max``.
    """
    return _first_readable(paths, group_limit)


def group_limit(fd: int) -> int | None:
    """The memory group's limit in bytes now, read on ``fd``; None if unreadable or unlimited.

    Read when the kernel's OOM killer has stopped a call, so the call's note states the
    limit the kernel held the turn to, not the one the host configured.
    """
    try:
        text = os.pread(fd, 65536, 0)
    except OSError:
        return None
    value = text.strip()
    if not value.isdigit():
        for line in text.splitlines():
            name, _, number = line.partition(b" ")
            if name == b"hierarchical_memory_limit":
                value = number.strip()
                break
    if not value.isdigit() or int(value) >= _UNLIMITED:
        return None
    return int(value)
