"""The kernel memory outside processes: the watch's readers on this host, doctor's hints and
the mechanism row, decided from host facts."""

from __future__ import annotations

import os
import select
import socket
import struct

import pytest

from astralvessel.sandbox._hostinfo import (
    HostFacts,
    PythonRuntime,
    shared_counters_hint,
    tcp_buffers_hint,
)
from astralvessel.sandbox._mechanisms import Setup, limit_mechanisms
from astralvessel.sandbox.server._kernelmem import (
    EPOLL_WATCH_BYTES,
    epoll_bytes,
    socket_buffers,
)

V1 = {"memory": "/sys/fs/cgroup/memory"}


def _facts(uid: int, **kwargs: object) -> HostFacts:
    return HostFacts(
        uid=uid,
        machine="x86_64",
        userns=True,
        python=PythonRuntime(executable="/usr/bin/python3", prefix="/usr"),
        **kwargs,  # type: ignore[arg-type]
    )


def test_an_ordinary_user_is_told_the_per_uid_counts_are_shared() -> None:
    """An ordinary user's hint names the epoll count and its size; root gets none."""
    hint = shared_counters_hint(_facts(1000, epoll_max_user_watches=4096))
    assert hint is not None
    assert "fs.epoll.max_user_watches: 4096 watches, about 1 MiB" in hint
    assert shared_counters_hint(_facts(0, epoll_max_user_watches=4096)) is None


@pytest.mark.parametrize(
    ("uid", "v1", "kmem_tcp", "hinted"),
    [(0, V1, False, True), (0, V1, True, False), (1000, V1, False, False), (0, {}, False, False)],
)
def test_root_on_v1_without_kmem_tcp_is_told_tcp_is_unbounded(uid, v1, kmem_tcp, hinted) -> None:
    """Only root with a v1 memory controller lacking memory.kmem.tcp gets the TCP hint."""
    facts = _facts(uid, cgroup_v1=v1, cgroup_kmem_tcp=kmem_tcp)
    assert (tcp_buffers_hint(facts) is not None) is hinted


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            Setup(memory_cgroup="cgroup v1", tcp_cgroup=True),
            "socket buffers, epoll watches and pipes counted by the memory watch (memory_mb); "
            "the turn's cgroup v1 memory group, TCP buffers up to memory_mb apart "
            "(memory.kmem.tcp); RLIMIT_SIGPENDING 1024 per call",
        ),
        (
            Setup(memory_cgroup="cgroup v1", server=False),
            "the turn's cgroup v1 memory group, not TCP buffers; RLIMIT_SIGPENDING 1024 per call",
        ),
        (
            Setup(),
            "socket buffers, epoll watches and pipes counted by the memory watch (memory_mb); "
            "RLIMIT_SIGPENDING 1024 per call",
        ),
    ],
)
def test_doctor_names_what_bounds_kernel_memory(setup: Setup, expected: str) -> None:
    """The kernel memory row says which of the watch, the group and the rlimit hold it."""
    assert limit_mechanisms(setup)["kernel memory"] == expected


def test_sock_diag_sees_a_filled_unix_pair() -> None:
    """The dump finds a unix pair's buffers by the sender's inode, and the receiver's queue
    once the sender closed."""
    sender, receiver = socket.socketpair()
    with sender, receiver:
        sender.setblocking(False)
        sender.send(b"x" * 65536)
        found = socket_buffers()
        assert found is not None
        assert found[os.fstat(sender.fileno()).st_ino] >= 65536
        inode = os.fstat(receiver.fileno()).st_ino
        sender.close()
        found = socket_buffers()
        assert found is not None
        assert found[inode] >= 65536


def test_sock_diag_sees_unread_loopback_tcp() -> None:
    """The dump finds the bytes an unread loopback connection holds."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as out:
            accepted, _ = listener.accept()
            with accepted:
                out.sendall(b"x" * 200_000)
                found = socket_buffers()
                assert found is not None
                held = found.get(os.fstat(out.fileno()).st_ino, 0)
                held += found.get(os.fstat(accepted.fileno()).st_ino, 0)
                assert held >= 200_000


def test_epoll_watches_are_weighed_per_watch() -> None:
    """An epoll descriptor with 10 watches weighs 10 watches."""
    read_end, write_end = os.pipe()
    fds = [os.dup(read_end) for _ in range(10)]
    try:
        with select.epoll() as instance:
            for fd in fds:
                instance.register(fd, select.EPOLLIN)
            path = f"/proc/{os.getpid()}/fd/{instance.fileno()}"
            assert epoll_bytes(path) == 10 * EPOLL_WATCH_BYTES
    finally:
        for fd in (*fds, read_end, write_end):
            os.close(fd)


def test_sock_diag_sees_unread_netlink_answers() -> None:
    """The dump finds the answers a route socket asked for and did not read."""
    ask = struct.pack("IHHII", 32, 18, 1, 1, 0) + struct.pack("BxHiII", 0, 0, 1, 0, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as route:
        for _ in range(20):
            route.send(ask)
        found = socket_buffers()
        assert found is not None
        assert found[os.fstat(route.fileno()).st_ino] > 20 * 500
