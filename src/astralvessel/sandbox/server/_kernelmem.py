"""Kernel memory a call pins that no process's RSS shows: socket buffers and epoll watches
(stdlib only, Python 3.8+).

Socket buffers are the kernel's, and cgroup v1 charges TCP's to a counter of
its own, unix sockets' to no group of an ordinary user: a call filling
loopback connections or unix pairs held hundreds of MiB to GiBs unseen. The
sandbox has a network namespace of its own, so every socket a call can make
is in it, and one ``sock_diag`` dump per family (unix, TCP and UDP over IPv4
and IPv6, netlink; what ``ss -m`` reads) gives
each socket's buffers by inode, those no process holds (in flight over a unix
socket, orphaned TCP) included. The memory watch charges each socket to the
call holding it (``socket:[inode]``) and the rest to the largest call.

An epoll watch is an ``epitem`` and a wait-queue entry in the kernel's slab
(about 192 + 64 bytes), counted per host uid (``fs.epoll.max_user_watches``):
an ordinary user's turns share one count with the host process itself. A call
that adds a million watches pinned 1.1 GiB and made every other epoll of the
uid fail; the watch counts each epoll descriptor's watches (its ``fdinfo``
lists one ``tfd:`` line per watch) at ``EPOLL_WATCH_BYTES``, or more where
that keeps a turn of ``memory_mb`` under ``1/EPOLL_SHARE`` of the uid's count.
"""

from __future__ import annotations

import _socket  # socket's C type: the socket module would import enum (see _lean)
import struct

__all__ = [
    "EPOLL_SHARE",
    "EPOLL_WATCH_BYTES",
    "NETLINK_SOCK_DIAG",
    "Sample",
    "epoll_bytes",
    "socket_buffers",
]

#: What the kernel's slab gives one epoll watch: an epitem (cache-aligned) and its entry.
EPOLL_WATCH_BYTES = 256

#: The netlink protocol the memory watch reads the sandbox's socket buffers with (the
#: server's seccomp list allows it: ``sandbox/_seccomp/_lists.py``).
NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_ALL_STATES = 0xFFFFFFFF
_LISTEN = 10  # TCP_LISTEN, which unix sockets' states share
# unix_diag: which attributes to show, and their numbers in the answer.
_UDIAG_SHOW_PEER, _UDIAG_SHOW_RQLEN, _UDIAG_SHOW_MEMINFO = 0x4, 0x10, 0x20
_UNIX_DIAG_PEER, _UNIX_DIAG_RQLEN, _UNIX_DIAG_MEMINFO = 2, 4, 5
_INET_DIAG_SKMEMINFO = 7
_NDIAG_PROTO_ALL, _NDIAG_SHOW_MEMINFO, _NETLINK_DIAG_MEMINFO = 255, 0x1, 0
# SK_MEMINFO_*: received, sent but unread by the peer, queued to send, backlog.
_RMEM_ALLOC, _WMEM_ALLOC, _FWD_ALLOC, _WMEM_QUEUED, _BACKLOG = 0, 2, 4, 5, 7
_SOCK_STREAM = 1
#: The IP protocols a call can open in its namespace that hold buffers (raw needs a capability).
#: Each with the line of ``/proc/net/sockstat*`` that counts its sockets in this namespace.
_INET = (
    (_socket.AF_INET, _socket.IPPROTO_TCP, "/proc/net/sockstat", b"TCP:"),
    (_socket.AF_INET6, _socket.IPPROTO_TCP, "/proc/net/sockstat6", b"TCP6:"),
    (_socket.AF_INET, _socket.IPPROTO_UDP, "/proc/net/sockstat", b"UDP:"),
    (_socket.AF_INET6, _socket.IPPROTO_UDP, "/proc/net/sockstat6", b"UDP6:"),
)
_TCP_LISTEN_STATE = 1 << 10


def _meminfo(values: bytes) -> int:
    """Bytes a socket holds, from its ``SK_MEMINFO`` array."""
    fields = struct.unpack_from(f"{len(values) // 4}I", values)
    wanted = (_RMEM_ALLOC, _WMEM_ALLOC, _FWD_ALLOC, _WMEM_QUEUED, _BACKLOG)
    return sum(fields[i] for i in wanted if i < len(fields))


def _attributes(data: bytes, start: int, end: int) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    while start + 4 <= end:
        length, kind = struct.unpack_from("HH", data, start)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[start + 4 : start + length]
        start += (length + 3) & ~3
    return found


def _dump(request: bytes) -> list[tuple[bytes, int]]:
    """Every answer of one sock_diag dump of this network namespace: (message, body offset)."""
    header = struct.pack(
        "IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
    )
    answers: list[tuple[bytes, int]] = []
    link = _socket.socket(
        _socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    )
    try:
        link.sendall(header + request)
        while True:
            data = link.recv(1 << 16)
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("IH", data, offset)
                if length < 16:
                    return answers
                if kind == _NLMSG_DONE:
                    return answers
                if kind == _NLMSG_ERROR:
                    raise OSError(f"sock_diag refused the dump: {data[offset : offset + 20]!r}")
                answers.append((data[offset : offset + length], 16))
                offset += (length + 3) & ~3
            if not data:
                return answers
    finally:
        link.close()


def _unix() -> dict[int, int]:
    request = struct.pack(
        "BBHIIIII",
        _socket.AF_UNIX,
        0,
        0,
        _ALL_STATES,
        0,
        _UDIAG_SHOW_PEER | _UDIAG_SHOW_RQLEN | _UDIAG_SHOW_MEMINFO,
        0,
        0,
    )
    sockets: dict[int, tuple[int, int, int, int]] = {}
    for message, body in _dump(request):
        kind, state, inode = (
            message[body + 1],
            message[body + 2],
            struct.unpack_from("I", message, body + 4)[0],
        )
        found = _attributes(message, body + 16, len(message))
        peer = struct.unpack("I", found[_UNIX_DIAG_PEER])[0] if _UNIX_DIAG_PEER in found else 0
        queued = 0
        if _UNIX_DIAG_RQLEN in found and state != _LISTEN:
            queued = struct.unpack_from("I", found[_UNIX_DIAG_RQLEN])[0]
            if kind != _SOCK_STREAM:
                queued *= _dgram_queue()  # the length of the first datagram only
        held = _meminfo(found[_UNIX_DIAG_MEMINFO]) if _UNIX_DIAG_MEMINFO in found else 0
        sockets[inode] = (held, peer, queued, 0)
    # What a unix socket sent is charged to it until read; once it closed, the bytes show
    # only in the receiver's queue.
    return {
        inode: held + (queued if peer not in sockets else 0)
        for inode, (held, peer, queued, _) in sockets.items()
    }


def _dgram_queue() -> int:
    """How many datagrams a unix socket may hold, plus one (``net.unix.max_dgram_qlen``)."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen", "rb") as handle:
            return int(handle.read()) + 1
    except (OSError, ValueError):
        return 11


def _in_use(path: str, label: bytes) -> int:
    """How many sockets of a protocol this network namespace has hashed (``inuse``)."""
    with open(path, "rb") as handle:
        for line in handle.read().splitlines():
            parts = line.split()
            if parts[:2] == [label, b"inuse"]:
                return int(parts[2])
    return 0


def _inet(family: int, protocol: int, path: str, label: bytes) -> dict[int, int]:
    """Each socket's buffers, by inode; empty without a dump when none can hold any.

    A TCP dump walks the kernel's one established table of every namespace (5.5 ms
    at load 11, where the whole sample of a call takes a fraction of that), so it is
    taken only when the namespace counts more TCP sockets than listeners (the relay's
    is one), which hold no buffers of their own: 27 µs for the count, 45 for them.
    """
    in_use = _in_use(path, label)
    if in_use == 0:
        return {}
    if protocol == _socket.IPPROTO_TCP and in_use <= len(
        _inet_dump(family, protocol, _TCP_LISTEN_STATE)
    ):
        return {}
    return _inet_dump(family, protocol, _ALL_STATES)


def _inet_dump(family: int, protocol: int, states: int) -> dict[int, int]:
    request = struct.pack(
        "BBBBI", family, protocol, 1 << (_INET_DIAG_SKMEMINFO - 1), 0, states
    ) + bytes(48)
    sockets: dict[int, int] = {}
    for message, body in _dump(request):
        inode = struct.unpack_from("I", message, body + 68)[0]
        found = _attributes(message, body + 72, len(message))
        if _INET_DIAG_SKMEMINFO in found:
            sockets[inode] = sockets.get(inode, 0) + _meminfo(found[_INET_DIAG_SKMEMINFO])
    return sockets


def _netlink() -> dict[int, int]:
    # A route socket a call never reads holds every answer it asked for: 152 MiB in a
    # turn of 64 from 64 sockets (replies to RTM_GETLINK, up to each one's SO_RCVBUF).
    request = struct.pack(
        "BBHIIII", _socket.AF_NETLINK, _NDIAG_PROTO_ALL, 0, 0, _NDIAG_SHOW_MEMINFO, 0, 0
    )
    sockets: dict[int, int] = {}
    for message, body in _dump(request):
        inode = struct.unpack_from("I", message, body + 16)[0]
        found = _attributes(message, body + 28, len(message))
        if _NETLINK_DIAG_MEMINFO in found:
            sockets[inode] = _meminfo(found[_NETLINK_DIAG_MEMINFO])
    return sockets


def socket_buffers() -> dict[int, int] | None:
    """Bytes each socket of this network namespace holds, by inode (0: sockets no
    descriptor names, such as TCP's orphans); None if the kernel answers no dump."""
    try:
        found = _unix()
        for row in (*_INET, None):
            try:
                more = _netlink() if row is None else _inet(*row)
            except (OSError, ValueError, IndexError):
                continue  # no such protocol here (IPv6 off, say)
            for inode, held in more.items():
                found[inode] = found.get(inode, 0) + held
    except OSError:
        return None
    return found


#: A turn holds at most this share of its uid's epoll watches before its calls are over:
#: an ordinary user's turns share the count with each other and the host process.
EPOLL_SHARE = 16


class Sample:
    """One memory sample's view of the kernel: every socket's buffers not yet charged, by
    inode, and what an epoll watch weighs and how many more the sample reads."""

    __slots__ = ("sockets", "watch_bytes", "watches_left")

    def __init__(self, sockets: dict[int, int] | None = None, limit: int = 0) -> None:
        self.sockets = {} if sockets is None else sockets
        share = _max_user_watches() // EPOLL_SHARE
        # Each watch weighs its slab, or its part of the turn's share of the uid's count
        # if that is more: ``limit`` bytes of watches are then at most that share.
        self.watch_bytes = max(EPOLL_WATCH_BYTES, limit // share) if share else EPOLL_WATCH_BYTES
        # Reading a watch's fdinfo line costs 1-7 us: no sample reads more than make the
        # turn's calls over ``limit`` on their own (unbounded without one).
        self.watches_left = limit // self.watch_bytes + 1 if limit else -1


def _max_user_watches() -> int:
    try:
        with open("/proc/sys/fs/epoll/max_user_watches", "rb") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 0


def epoll_bytes(path: str, sample: Sample | None = None) -> int:
    """Bytes the watches of the epoll descriptor at ``path`` (``/proc/N/fd/M``) pin, as
    ``sample`` weighs them, read no further than its budget."""
    sample = Sample() if sample is None else sample
    head, _, number = path.rpartition("/fd/")
    watches = 0
    try:
        with open(f"{head}/fdinfo/{number}", "rb") as handle:
            while sample.watches_left != 0:
                block = handle.read(1 << 20)
                if not block:
                    break
                count = block.count(b"\ntfd:")
                watches += count
                if sample.watches_left > 0:
                    sample.watches_left = max(0, sample.watches_left - count)
    except OSError:
        return 0
    return watches * sample.watch_bytes
