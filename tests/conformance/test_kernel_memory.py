"""Promise: kernel memory a call pins outside any process (socket buffers, epoll watches,
queued signals) is held to the turn's bounds, as root and as an ordinary user.

Each flood stops itself at a ceiling far above the turn's limit (a few hundred MiB at
most, so a failing run cannot hurt a shared host) and prints what it held; the test asserts
the turn's bound stopped it first.
"""

from __future__ import annotations

import attrs

from .calls import PYTHON, run
from .conftest import TEST_LIMITS
from .test_limits import HOLD_S, _hold_s

#: The turns' memory limit, and the ceiling at which each flood stops itself: eight times it.
LIMIT_MB = 64
CEILING_MB = 512

#: ``conns`` loopback connections, each written to and never read, until they hold the
#: ceiling or stall (the kernel refused more); a short pause per round, as a call that does
#: anything else between writes would make.
_TCP_FLOOD = """
import socket, sys, time
ceiling, conns, hold = int(sys.argv[1]) << 20, int(sys.argv[2]), float(sys.argv[3])
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(conns)
pairs, held, stalled, chunk = [], 0, 0, b"x" * 65536
for _ in range(conns):
    out = socket.create_connection(listener.getsockname())
    out.setblocking(False)
    pairs.append((out, listener.accept()[0]))
while held < ceiling and stalled < 40:
    moved = 0
    for out, _ in pairs:
        try:
            moved += out.send(chunk)
        except BlockingIOError:
            pass
    held, stalled = held + moved, 0 if moved else stalled + 1
    time.sleep(0.005)
print("held", held >> 20, "MiB", flush=True)
time.sleep(hold)
print("ended on its own")
"""

#: Unix socket pairs, each filled until its sender would block and kept: buffers no
#: process's memory shows, charged (cgroup v1) to no group of an ordinary user.
_UNIX_FLOOD = """
import socket, sys, time
ceiling, hold = int(sys.argv[1]) << 20, float(sys.argv[2])
pairs, held, chunk = [], 0, b"x" * 65536
while held < ceiling:
    sender, receiver = socket.socketpair()
    sender.setblocking(False)
    pairs.append((sender, receiver))
    try:
        while True:
            held += sender.send(chunk)
    except BlockingIOError:
        pass
    time.sleep(0.002)
print("held", held >> 20, "MiB", flush=True)
time.sleep(hold)
print("ended on its own")
"""

#: Epoll instances that each watch the same 200 descriptors: about 256 bytes of kernel slab
#: per watch, counted per host uid (an ordinary user's turns and host share one count).
_EPOLL_FLOOD = """
import os, select, sys, time
ceiling, hold = int(sys.argv[1]), float(sys.argv[2])
read_end, _ = os.pipe()
watched = [os.dup(read_end) for _ in range(200)]
instances, watches = [], 0
try:
    while watches < ceiling:
        instance = select.epoll()
        instances.append(instance)
        for fd in watched:
            instance.register(fd, select.EPOLLIN)
            watches += 1
except OSError as exc:
    print("refused:", exc.strerror, flush=True)
print("watches", watches, flush=True)
time.sleep(hold)
print("ended on its own")
"""

#: Netlink route sockets that each ask for the loopback's link 3000 times and never read
#: the answers: each queues them up to its receive buffer.
_NETLINK_FLOOD = """
import socket, struct, sys, time
ceiling, hold = int(sys.argv[1]) << 20, float(sys.argv[2])
ask = struct.pack("IHHII", 32, 18, 1, 1, 0) + struct.pack("BxHiII", 0, 0, 1, 0, 0)
sockets, queued = [], 0
while queued < ceiling:
    route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    route.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sockets.append(route)
    for _ in range(3000):
        route.send(ask)
    queued += route.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    time.sleep(0.01)
print("sockets", len(sockets), flush=True)
time.sleep(hold)
print("ended on its own")
"""


#: How long the epoll flood holds its watches: a memory sample reads every watch's line
#: (1-7 us each), and the next waits ten times that, so its stop can take seconds at load.
EPOLL_HOLD_S = 45


def _flooded(backend, policy, request, *argv: str, hold_s: float | None = None) -> None:
    """Run a flood in a turn of ``LIMIT_MB``; it is stopped with the memory note, and the
    turn goes on."""
    limits = attrs.evolve(TEST_LIMITS, memory_mb=LIMIT_MB, open_files=4096)
    session = backend.start(attrs.evolve(policy, limits=limits))
    try:
        hold = str(hold_s if hold_s is not None else _hold_s(request, backend))
        outcome = run(session, PYTHON, "-c", *argv, hold, timeout=90.0)
        assert not outcome.timed_out, outcome.output
        assert "ended on its own" not in outcome.output, outcome.output
        assert "[memory limit:" in outcome.output, outcome.output
        after = run(session, "/bin/echo", "after")
        assert (after.exit_code, after.output) == (0, "after\n")
    finally:
        session.close()


def test_loopback_tcp_buffers_count_against_the_turns_memory(backend, policy, request):
    """48 loopback connections written to and never read are stopped at the turn's limit."""
    _flooded(backend, policy, request, _TCP_FLOOD, str(CEILING_MB), "48")


def test_unix_pair_buffers_count_against_the_turns_memory(backend, policy, request):
    """Unix socket pairs filled and kept are stopped at the turn's limit."""
    _flooded(backend, policy, request, _UNIX_FLOOD, str(CEILING_MB))


def test_netlink_answers_count_against_the_turns_memory(backend, policy, request):
    """Route sockets holding answers never read are stopped at the turn's limit."""
    _flooded(backend, policy, request, _NETLINK_FLOOD, str(CEILING_MB))


def test_epoll_watches_count_against_the_turns_memory(backend, policy, request):
    """A call adding epoll watches by the hundred thousand is stopped at the turn's limit,
    long before the host uid's count (``fs.epoll.max_user_watches``) runs out."""
    # 160 MiB of watches at 256 bytes each (the descriptor limit allows about 780 000).
    ceiling_watches = (160 << 20) // 256
    hold = EPOLL_HOLD_S if _hold_s(request, backend) == HOLD_S else None
    _flooded(backend, policy, request, _EPOLL_FLOOD, str(ceiling_watches), hold_s=hold)


def test_queued_signals_are_bounded_per_call(session):
    """A call queueing real-time signals to itself is refused (EAGAIN) at 1024, far below the
    host uid's count an ordinary user's turns share with the host."""
    outcome = run(
        session,
        PYTHON,
        "-c",
        """
import ctypes, os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
libc = ctypes.CDLL(None, use_errno=True)
queued = 0
while queued < 20000:
    if libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) != 0:
        print("refused", os.strerror(ctypes.get_errno()))
        break
    queued += 1
print("queued", queued)
""",
    )
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.output.split("\n")
    assert "refused Resource temporarily unavailable" in lines, outcome.output
    queued = int(outcome.output.split("queued ")[1].split()[0])
    assert 0 < queued <= 1024, outcome.output
