"""A fresh Docker turn's fork, as root, freezes its workspace in place (``docker._freeze``).

The host runs the server's freeze steps in the container server's mount namespace
and stages the clone in its store, where the forks' host overlays open on it by
path, as on a store tree: no file is copied. The conformance suite's fork and
snapshot tests run the attacks on the forks; these check what is Docker's own:
the layer is the container's tmpfs, staged and read-only, the parent writes on
above it, and a refusal (a detached process running) leaves the turn as it was
and the fork to a copy.
"""

from __future__ import annotations

import errno
import io
import os
import subprocess

import pytest

from astralvessel import Executor, Registry, Turn, TurnSnapshot
from astralvessel._executor._snapshot._store import store_root
from astralvessel.sandbox import DetachRequest, FsRequest, Policy, RunRequest, SandboxSession
from astralvessel.sandbox._frozen import freeze
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker import _freeze as docker_freeze

from .conftest import SMALL_LIMITS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the host mounts as root only")

#: Eight files of 256 KiB each, in two folders, and one small file to change.
_MAKE = (
    "cd /workspace && mkdir a b && for i in 0 1 2 3; do "
    "head -c 262144 /dev/urandom > a/$i; head -c 262144 /dev/urandom > b/$i; done && "
    "echo kept > kept"
)
_SUMS = (
    "cd /workspace && find . -path ./outbox -prune -o -type f -print | LC_ALL=C sort | xargs md5sum"
)


def _sh(turn: Turn, script: str) -> str:
    result = turn.exec(["sh", "-c", script])
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def _writes_on(session: SandboxSession) -> None:
    """A call and a file request both write the workspace: it is not left read-only."""
    outcome = session.run(
        RunRequest(
            argv=("sh", "-c", "echo x > /workspace/f && cat /workspace/f"),
            timeout=30,
            output_chars=1000,
        )
    )
    assert outcome.output == "x\n"
    wrote = session.fs(FsRequest(op="write", path="g", data=b"g", timeout=10))
    assert wrote.errno is None, wrote.message


def _store_kib() -> int:
    """The store's own disk use (a staged layer is another filesystem, left out)."""
    done = subprocess.run(["du", "-skx", store_root()], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def test_a_fresh_turns_fork_freezes_its_workspace_in_place(backend: Docker) -> None:
    """fork(3) copies nothing into the store: the snapshot is the container's tmpfs, staged
    and read-only. Each fork sees the parent's files; a fork's writes reach neither its
    siblings nor the parent; the parent writes on, unseen by the forks; a fork's snapshot
    saves and loads."""
    with Executor(Registry([]), sandbox=backend, limits=SMALL_LIMITS) as executor:
        with executor.turn() as parent:
            _sh(parent, _MAKE)
            sums = _sh(parent, _SUMS)
            before = _store_kib()
            forks = parent.fork(3)
            source = forks[0].snapshot_source
            assert source is not None
            assert source.layer is not None  # frozen, not captured
            assert os.path.ismount(source.path)
            assert os.stat(source.path).st_dev != os.stat(store_root()).st_dev
            assert _store_kib() - before < 256  # 2 MiB of files: nothing copied
            assert os.statvfs(source.path).f_flag & os.ST_RDONLY
            _sh(parent, "cd /workspace && echo later >> kept && echo new > new")
            assert _sh(parent, "cat /workspace/kept /workspace/new") == "kept\nlater\nnew\n"
            first, second, third = forks
            with first, second, third:
                for fork in forks:
                    assert _sh(fork, _SUMS) == sums
                _sh(first, "cd /workspace && echo mine > kept && rm a/0 && echo own > own")
                assert _sh(second, _SUMS) == sums
                assert _sh(parent, "cat /workspace/kept; ls /workspace/a") == (
                    "kept\nlater\n0\n1\n2\n3\n"
                )
                taken = first.snapshot()
            assert (source.path / "kept").read_bytes() == b"kept\n"
        assert (taken.path / "kept").read_bytes() == b"mine\n"
        assert not (taken.path / "a" / "0").exists()
        saved = io.BytesIO()
        taken.save(saved)
        loaded = TurnSnapshot.load(io.BytesIO(saved.getvalue()))
        assert loaded == taken
        with executor.turn(snapshot=loaded) as again:
            assert _sh(again, "cat /workspace/kept /workspace/own") == "mine\nown\n"


def test_the_frozen_layer_is_read_only_from_the_forks_the_parent_and_the_host(
    backend: Docker,
) -> None:
    """A fork's write and chmod reach its own layer only; the parent cannot uncover the
    frozen tmpfs (no capability in its sandbox) to write it; even root on the host finds
    the staged layer read-only."""
    executor = Executor(Registry([]), sandbox=backend, limits=SMALL_LIMITS)
    with executor, executor.turn() as parent:
        _sh(parent, _MAKE)
        (fork,) = parent.fork(1)
        source = fork.snapshot_source
        assert source is not None
        assert source.layer is not None
        mode = os.stat(source.path / "kept").st_mode
        with fork:
            _sh(fork, "cd /workspace && chmod 600 kept && echo fork >> kept && rm b/1")
            assert _sh(fork, "cat /workspace/kept") == "kept\nfork\n"
        _sh(
            parent,
            "{ umount /workspace; umount -l /workspace; true; } 2>/dev/null; "
            "echo parent >> /workspace/kept",
        )
        assert (source.path / "kept").read_bytes() == b"kept\n"
        assert os.stat(source.path / "kept").st_mode == mode
        assert (source.path / "b" / "1").exists()
        with pytest.raises(OSError, match="Read-only") as refused:
            (source.path / "kept").write_bytes(b"host\n")
        assert refused.value.errno == errno.EROFS


def test_a_running_detached_process_leaves_the_fork_to_a_copy(backend: Docker) -> None:
    """The server refuses the freeze (EBUSY) while a detached process runs: the turn is as
    it was (its workspace writable, its process still writing) and its fork is a capture."""
    executor = Executor(Registry([]), sandbox=backend, limits=SMALL_LIMITS)
    with executor, executor.turn() as parent:
        _sh(parent, _MAKE)
        process = parent.start(["sh", "-c", "sleep 2; echo done > /workspace/late"])
        (fork,) = parent.fork(1)
        source = fork.snapshot_source
        assert source is not None
        assert source.layer is None  # a capture: a tree of the store's own
        assert os.stat(source.path).st_dev == os.stat(store_root()).st_dev
        assert process.result(timeout=30).returncode == 0
        assert _sh(parent, "echo after >> /workspace/kept; cat /workspace/late") == "done\n"
        assert _sh(parent, "grep -c ' /workspace .* - tmpfs ' /proc/self/mountinfo") == "1\n"
        with fork:
            assert _sh(fork, "cat /workspace/kept") == "kept\n"


def test_the_server_refuses_while_a_call_runs_and_the_host_changes_nothing(
    backend: Docker,
) -> None:
    """``freeze`` itself: EBUSY from the server's ``prepare`` leaves the tmpfs writable;
    once made, a second freeze is refused (the workspace is an overlay now)."""
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        session.fs(FsRequest(op="write", path="f", data=b"one", truncate=True, timeout=10))
        process = session.detach(DetachRequest(argv=("sleep", "2"), log_chars=100))
        with pytest.raises(OSError, match="still run") as busy:
            freeze(session, 8 << 20)
        assert busy.value.errno == errno.EBUSY
        assert process.result(timeout=30).returncode == 0
        wrote = session.fs(FsRequest(op="write", path="f", data=b"two", truncate=True, timeout=10))
        assert wrote.errno is None, wrote.message
        clone = freeze(session, 8 << 20)
        try:
            assert os.fstatvfs(clone).f_flag & os.ST_RDONLY
            with open(f"/proc/self/fd/{clone}/f", "rb") as frozen:
                assert frozen.read() == b"two"
        finally:
            os.close(clone)
        with pytest.raises(OSError, match="not the sandbox's own tmpfs") as again:
            freeze(session, 8 << 20)
        assert again.value.errno == errno.EOPNOTSUPP
    finally:
        session.close()


def test_a_step_refused_in_the_servers_namespace_leaves_the_turn_as_it_was(
    backend: Docker,
) -> None:
    """A file open for writing on the tmpfs (here the host's, through the server's root)
    makes the kernel refuse the read-only reconfigure in the host's child (EBUSY): the
    tmpfs is thawed, the server's views go on, and the next freeze, once it is closed, is
    made."""
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        pid = session.channel.host_pid()  # type: ignore[attr-defined]
        held = os.open(f"/proc/{pid}/root/workspace/held", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError, match="cannot be frozen") as busy:
                freeze(session, 8 << 20)
            assert busy.value.errno == errno.EBUSY
            _writes_on(session)
        finally:
            os.close(held)
        os.close(freeze(session, 8 << 20))
        outcome = session.run(
            RunRequest(
                argv=("sh", "-c", "grep -c ' /workspace ' /proc/self/mountinfo"),
                timeout=30,
                output_chars=1000,
            )
        )
        assert outcome.output == "2\n"  # the frozen tmpfs, the overlay above it
    finally:
        session.close()


#: The host's step stopped between its steps: the superblock made read-only, no overlay
#: laid, and then a hang, which the host's timeout kills.
_HANGS_HALFWAY = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); from server import _sys; "
    "from server._freeze import _set_ro\n"
    "_sys.setns(int(sys.argv[2]), _sys.CLONE_NEWNS)\n"
    "_set_ro(sys.argv[4], True)\n"
    "time.sleep(600)"
)


def test_a_step_killed_halfway_at_its_timeout_leaves_the_workspace_writable(
    backend: Docker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child killed at the freeze's timeout undoes nothing: the host thaws the tmpfs it
    left read-only with no overlay, so the turn writes on, and the next freeze is made."""
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        with monkeypatch.context() as patched:
            patched.setattr(docker_freeze, "_FREEZE", _HANGS_HALFWAY)
            with pytest.raises(OSError, match="did not end in time") as late:
                freeze(session, 8 << 20, timeout=2)
        assert late.value.errno == errno.ETIMEDOUT
        _writes_on(session)
        os.close(freeze(session, 8 << 20))
    finally:
        session.close()


def test_a_thaw_that_fails_says_the_workspace_may_be_read_only(
    backend: Docker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the thaw cannot be made either, the error says what the turn is left with."""
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        monkeypatch.setattr(docker_freeze, "_FREEZE", _HANGS_HALFWAY)
        monkeypatch.setattr(docker_freeze, "_THAW", "import sys; sys.exit('EIO refused')")
        with pytest.raises(OSError, match="may be left read-only") as late:
            freeze(session, 8 << 20, timeout=2)
        assert late.value.errno == errno.ETIMEDOUT
        assert "EIO refused" in str(late.value)
    finally:
        session.close()
