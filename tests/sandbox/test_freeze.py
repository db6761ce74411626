"""A workspace frozen in place (``server/_freeze``, ``sandbox/_frozen``), on real sandboxes.

The turn writes on in its overlay, by calls and file primitives; the host's clone shows
the files as they were at the freeze, and stays so; nothing writes through it, nor
through any other mount of the frozen tmpfs (a process whose working folder was in it);
a file open for writing makes the server refuse and leave the turn as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator

import pytest

from astralvessel.sandbox import Limits, Policy
from astralvessel.sandbox._api import (
    DetachRequest,
    FsReply,
    FsRequest,
    RunRequest,
    SandboxSession,
)
from astralvessel.sandbox._bwrap import Bubblewrap
from astralvessel.sandbox._frozen import freeze, server_pid
from astralvessel.sandbox._nsjail import Nsjail
from astralvessel.sandbox.server import _sys

BACKENDS = {"bubblewrap": Bubblewrap, "nsjail": Nsjail}
UPPER_BYTES = 8 << 20


@pytest.fixture(params=sorted(BACKENDS))
def session(request: pytest.FixtureRequest) -> Iterator[SandboxSession]:
    """A turn of the backend, its workspace holding ``a.txt`` (a call's) and ``b.txt`` (the
    host's file primitive's)."""
    started = BACKENDS[request.param]().start(Policy(limits=Limits(disk_mb=64)))
    try:
        assert _sh(started, "echo hello > a.txt && mkdir -p d && echo deep > d/e.txt") == ""
        assert _write(started, "b.txt", b"bee").errno is None
        yield started
    finally:
        started.close()


def _sh(session: SandboxSession, script: str) -> str:
    outcome = session.run(RunRequest(argv=("sh", "-c", script), timeout=30, output_chars=10000))
    return outcome.output


def _write(session: SandboxSession, path: str, data: bytes) -> FsReply:
    request = FsRequest(op="write", path=path, data=data, truncate=True, timeout=10)
    return session.fs(request)


def _read(session: SandboxSession, path: str) -> bytes:
    reply = session.fs(FsRequest(op="read", path=path, length=1 << 20, timeout=10))
    assert reply.errno is None, reply.message
    return reply.data


def _clone_file(clone: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=clone)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def _frozen(session: SandboxSession) -> int:
    """Freeze the session's workspace; the clone's descriptor."""
    return freeze(session, UPPER_BYTES)


def _held_dev(pidfd: int, number: int) -> int | None:
    """The device of the server's descriptor ``number``, if it has one."""
    try:
        fd = _sys.pidfd_getfd(pidfd, number)
    except OSError as error:
        if error.errno != errno.EBADF:
            raise
        return None
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def _mounts(session: SandboxSession) -> list[str]:
    """The filesystem types mounted at /workspace, as a call sees them, bottom first."""
    table = _sh(session, "cat /proc/self/mountinfo")
    return [
        line.split(" - ")[1].split()[0] for line in table.splitlines() if " /workspace " in line
    ]


def test_the_turn_writes_on_after_the_freeze(session: SandboxSession) -> None:
    """Calls and file primitives write, read and remove in the overlay; the upper layer is
    bounded by the freeze's byte limit."""
    clone = _frozen(session)
    os.close(clone)
    assert _mounts(session) == ["tmpfs", "overlay"]
    out = _sh(session, "echo more >> a.txt && echo new > c.txt && rm d/e.txt && cat a.txt c.txt")
    assert out == "hello\nmore\nnew\n"
    assert _write(session, "b.txt", b"BEE!").errno is None  # a fresh file worker's view
    assert _write(session, "d/f.txt", b"f").errno is None
    assert _read(session, "b.txt") == b"BEE!"
    assert _read(session, "a.txt") == b"hello\nmore\n"
    listing = session.fs(FsRequest(op="list", path="/workspace", timeout=10))
    assert listing.errno is None
    assert all(name in listing.data for name in (b"a.txt", b"b.txt", b"c.txt"))
    # The calls' user owns the merged root as it owned the frozen one.
    assert (
        _sh(session, "stat -c %U:%a . && touch x && echo ok")
        == _sh(session, "stat -c %U:%a /workspace") + "ok\n"
    )
    # The upper layer holds at most UPPER_BYTES.
    assert "No space left" in _sh(session, f"head -c {2 * UPPER_BYTES} /dev/zero > big; echo")
    _sh(session, "rm -f big")


def test_the_clone_shows_the_old_files_unchanged(session: SandboxSession) -> None:
    """The host's descriptor shows the workspace as it was at the freeze, whatever the turn
    rewrites, removes or adds after it."""
    clone = _frozen(session)
    try:
        assert _clone_file(clone, "a.txt") == b"hello\n"
        _sh(session, "echo rewritten > a.txt && rm -r d && echo new > c.txt")
        assert _write(session, "b.txt", b"changed").errno is None
        assert _clone_file(clone, "a.txt") == b"hello\n"
        assert _clone_file(clone, "b.txt") == b"bee"
        assert _clone_file(clone, "d/e.txt") == b"deep\n"
        assert "c.txt" not in os.listdir(f"/proc/self/fd/{clone}")
    finally:
        os.close(clone)


def test_nothing_writes_through_the_clone(session: SandboxSession) -> None:
    """The clone's mount and its tmpfs are read-only: EROFS for every kind of write."""
    clone = _frozen(session)
    try:
        attempts: dict[str, Callable[[], None]] = {
            "create": lambda: os.close(os.open("x", os.O_WRONLY | os.O_CREAT, dir_fd=clone)),
            "append": lambda: os.close(os.open("a.txt", os.O_WRONLY | os.O_APPEND, dir_fd=clone)),
            "mkdir": lambda: os.mkdir("dir", dir_fd=clone),
            "unlink": lambda: os.unlink("b.txt", dir_fd=clone),
            "rename": lambda: os.rename("a.txt", "z.txt", src_dir_fd=clone, dst_dir_fd=clone),
        }
        for what, attempt in attempts.items():
            with pytest.raises(OSError, match="Read-only file system") as caught:
                attempt()
            assert caught.value.errno == errno.EROFS, what
        assert _clone_file(clone, "a.txt") == b"hello\n"
    finally:
        os.close(clone)


def test_a_file_open_for_writing_refuses_the_freeze(session: SandboxSession) -> None:
    """A detached process holding a file open for writing: EBUSY (the server refuses while
    it runs; the kernel would too), and the turn is as it was (its tmpfs alone,
    writable); once the process is gone the freeze is made."""
    script = "exec 3>>/workspace/log; echo open; exec sleep 60"
    process = session.detach(DetachRequest(argv=("sh", "-c", script), log_chars=1000))
    try:
        _sh(session, "for i in $(seq 100); do [ -e log ] && break; sleep 0.05; done")
        with pytest.raises(OSError, match=r"still run|busy") as caught:
            _frozen(session)
        assert caught.value.errno == errno.EBUSY
        assert _mounts(session) == ["tmpfs"]
        assert _sh(session, "echo again >> a.txt && cat a.txt") == "hello\nagain\n"
        assert _write(session, "b.txt", b"still").errno is None
    finally:
        process.kill()
    with contextlib.suppress(Exception):  # killed: how the result says so is not tested here
        process.result(timeout=30)
    clone = _frozen(session)
    try:
        assert _clone_file(clone, "b.txt") == b"still"
    finally:
        os.close(clone)


def test_a_running_process_refuses_the_freeze(session: SandboxSession) -> None:
    """A detached process (its working folder the workspace, nothing open for writing)
    would keep the workspace as it was frozen, its later writes refused: EBUSY while it
    runs, the turn as it was; once it is gone the freeze is made."""
    script = "cd /workspace && mkdir ready && exec sleep 60"
    process = session.detach(DetachRequest(argv=("sh", "-c", script), log_chars=1000))
    try:
        _sh(session, "for i in $(seq 200); do [ -d ready ] && break; sleep 0.05; done")
        with pytest.raises(OSError, match="still run") as caught:
            _frozen(session)
        assert caught.value.errno == errno.EBUSY
        assert _mounts(session) == ["tmpfs"]
        assert _write(session, "b.txt", b"after").errno is None
    finally:
        process.kill()
    with contextlib.suppress(Exception):  # killed: how the result says so is not tested here
        process.result(timeout=30)
    clone = _frozen(session)
    try:
        assert _clone_file(clone, "b.txt") == b"after"
        assert os.path.isdir(f"/proc/self/fd/{clone}/ready")
    finally:
        os.close(clone)


def test_a_second_freeze_is_refused_and_the_server_keeps_no_copy(
    session: SandboxSession,
) -> None:
    """The workspace is an overlay once frozen: a second freeze answers EOPNOTSUPP. Once
    the host took the clone the server holds no descriptor of the frozen tmpfs, and a
    release of a number it does not hold is refused."""
    clone = _frozen(session)
    frozen_dev = os.fstat(clone).st_dev
    os.close(clone)
    with pytest.raises(OSError, match="not the sandbox's own tmpfs") as caught:
        _frozen(session)
    assert caught.value.errno == errno.EOPNOTSUPP
    pidfd = _sys.pidfd_open(server_pid(session))
    try:
        held = [dev for dev in (_held_dev(pidfd, n) for n in range(256)) if dev is not None]
        assert held
        assert frozen_dev not in held
    finally:
        os.close(pidfd)
    released = session.fs(FsRequest(op="freeze", timeout=10, fields={"phase": "release", "fd": 3}))
    assert released.errno == "EBADF"


def test_after_the_freeze_new_processes_and_the_snapshot_listing_see_the_overlay(
    session: SandboxSession,
) -> None:
    """A detached process started after the freeze (on a spare made again) writes in the
    overlay; a snapshot's listing (the copy the host falls back to) lists the merged files."""
    clone = _frozen(session)
    os.close(clone)
    script = "echo later > /workspace/later.txt && cat /workspace/a.txt"
    process = session.detach(DetachRequest(argv=("sh", "-c", script), log_chars=1000))
    assert process.result(timeout=30).stdout == b"hello\n"
    assert _read(session, "later.txt") == b"later\n"
    listing = session.fs(
        FsRequest(op="pack", timeout=10, fields={"phase": "list", "max_files": 100})
    )
    assert listing.errno is None, listing.message
    for name in (b"a.txt", b"b.txt", b"later.txt", b"e.txt"):
        assert name in listing.data


class _RemoteSession:
    """A session whose server is no process of this host (Docker's): no ``channel.process``."""

    backend = "docker"
    ready_info = {"pid": 1}  # noqa: RUF012 - read only

    def fs(self, request: FsRequest) -> FsReply:
        raise AssertionError("nothing may be asked of a server the host cannot take from")


def test_a_server_that_is_no_process_of_this_host_is_not_asked() -> None:
    """Where the server is no process of this host and its channel passes no descriptor (a
    remote engine's Docker session), ``freeze`` raises before it sends anything: the
    workspace is left as it is and the host copies. As root: ENOSYS, the host cannot
    mount in the server's namespace; as an ordinary user: EOPNOTSUPP, the server could
    not pass its held layer over the engine's attach stream."""
    if os.geteuid() == 0:
        expected, errno_ = "not a process of this host", errno.ENOSYS
    else:
        expected, errno_ = "carries no descriptors", errno.EOPNOTSUPP
    with pytest.raises(OSError, match=expected) as caught:
        freeze(_RemoteSession(), UPPER_BYTES)  # type: ignore[arg-type]
    assert caught.value.errno == errno_


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_writable_root_keeps_its_layers_writable(backend: str) -> None:
    """The writable root's upper layers live in the workspace's tmpfs: no freeze there
    (EOPNOTSUPP), and the root stays writable."""
    policy = Policy(limits=Limits(disk_mb=64), writable_root=True)
    session = BACKENDS[backend]().start(policy)
    try:
        with pytest.raises(OSError, match="writable root's layers") as caught:
            _frozen(session)
        assert caught.value.errno == errno.EOPNOTSUPP
        assert _sh(session, "echo x > /usr/local/freeze-probe && echo ok") == "ok\n"
    finally:
        session.close()
