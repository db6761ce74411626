"""A Docker fork's own layer, as root, frozen in place (``docker._freeze.freeze_fork_layer``).

A Docker turn opened on a snapshot lies on the host's overlay (``docker._cow``). Its
fork freezes that overlay's upper layer alone: the host's child clones the layer and
freezes its tmpfs in the host's mount namespace, makes the new overlay there on the
layer over the old overlay's lower layers, and moves it onto ``/workspace`` in the
server's mount namespace. ``tests/snapshot/test_frozen_stack.py`` runs the forks of a
fork on it (the stack, its bound, its budget, its lifetime, the hostile forks); these
check what is Docker's own: the layer handed over, the container's new workspace, the
listing of the turn's new layer, and what a refused or killed step leaves.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from astralvessel.sandbox import FsRequest, Policy, RunRequest, SandboxSession
from astralvessel.sandbox._frozen import LayerLost, freeze_fork_layer
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker import _freeze as docker_freeze

from .conftest import SMALL_LIMITS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the host mounts as root only")

#: The host's step stopped after the freeze: the layer's tmpfs read-only, no overlay laid,
#: then a hang, which the host's timeout kills (``argv[6]``: the upper folder).
_HANGS_BEFORE_THE_OVERLAY = (
    "import sys, time; sys.path.insert(0, sys.argv[1]); "
    "from server._freeze import _set_ro, _upper_clone\n"
    "_set_ro('', True, at=_upper_clone(int(sys.argv[6]), -1))\n"
    "time.sleep(600)"
)
#: The host's step made whole, then a hang before it sends the layer: killed, the turn
#: lies on a layer the host never got.
_HANGS_AFTER_THE_OVERLAY = docker_freeze._FREEZE_FORK.replace(
    "socket.send_fds(", "__import__('time').sleep(600) or socket.send_fds("
)

#: The host's step made whole, and nothing sent back: the child ends as if it had.
_SENDS_NOTHING = docker_freeze._FREEZE_FORK.replace("socket.send_fds(", "(lambda *_: None)(")


def _tree(tmp_path: Path) -> Path:
    """A snapshot's tree as the store holds it: the host's files, not the calls'."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_text("base\n")
    (tree / "kept").write_text("kept\n")
    for path in (tmp_path, tree, tree / "d"):
        path.chmod(0o755)
    return tree


def _sh(session: SandboxSession, script: str) -> str:
    outcome = session.run(RunRequest(argv=("sh", "-c", script), timeout=30, output_chars=4000))
    assert outcome.exit_code == 0, outcome.output
    return outcome.output


def _writes_on(session: SandboxSession) -> None:
    """A call and a file request both write the workspace: it is not left read-only."""
    assert _sh(session, "echo x > /workspace/w && cat /workspace/w") == "x\n"
    wrote = session.fs(FsRequest(op="write", path="g", data=b"g", timeout=10))
    assert wrote.errno is None, wrote.message


def _names(fd: int) -> set[str]:
    """The names a layer holds (its descriptor's folder), the folder's own included."""
    found: set[str] = set()
    for folder, subfolders, files in os.walk(f"/proc/self/fd/{fd}"):
        rel = os.path.relpath(folder, f"/proc/self/fd/{fd}")
        found.update(os.path.normpath(os.path.join(rel, name)) for name in (*subfolders, *files))
    return found


@pytest.fixture
def fork(backend: Docker, tmp_path: Path) -> SandboxSession:
    """A turn on the host's overlay of a snapshot's tree that changed a file and made one."""
    session = backend.start(Policy(limits=SMALL_LIMITS, workspace_lower=_tree(tmp_path)))
    _sh(session, "cd /workspace && echo mine >> d/f && echo new > new")
    yield session
    session.close()


def test_the_forks_own_layer_is_frozen_and_it_writes_on_above_it(
    fork: SandboxSession, tmp_path: Path
) -> None:
    fd, userxattr = freeze_fork_layer(fork, 8 << 20)
    try:
        assert userxattr is False  # the host's overlay: trusted.* attributes
        assert os.fstatvfs(fd).f_flag & os.ST_RDONLY
        # The fork's own layer alone: what it changed and made (and the server's outbox),
        # not the tree's files.
        assert _names(fd) == {"d", "d/f", "new", "outbox"}
        assert Path(f"/proc/self/fd/{fd}/d/f").read_text() == "base\nmine\n"
        _writes_on(fork)
        view = "cd /workspace && cat d/f kept new && grep -c ' /workspace ' /proc/self/mountinfo"
        # The host's overlay bound in, the new overlay moved over it.
        assert _sh(fork, view) == "base\nmine\nkept\nnew\n2\n"
        # The listing is the new upper layer's now: what the turn wrote since (and the
        # server's outbox, made again), not what the frozen layer holds.
        assert fork.upper_names is not None  # type: ignore[attr-defined]
        assert fork.upper_names() - {b"outbox"} == {b"w", b"g"}  # type: ignore[attr-defined]
        with pytest.raises(OSError, match="froze its layer already") as again:
            freeze_fork_layer(fork, 8 << 20)
        assert again.value.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    assert (tmp_path / "tree" / "d" / "f").read_text() == "base\n"


def test_a_fresh_turn_has_no_layer_of_its_own_to_stack(backend: Docker) -> None:
    session = backend.start(Policy(limits=SMALL_LIMITS))
    try:
        with pytest.raises(OSError, match="no overlay the host laid") as refused:
            freeze_fork_layer(session, 8 << 20)
        assert refused.value.errno == errno.EOPNOTSUPP
        _writes_on(session)
    finally:
        session.close()


def test_a_file_open_for_writing_refuses_the_freeze_and_changes_nothing(
    fork: SandboxSession,
) -> None:
    """Held open through the server's root (the layer's file, copied up): the kernel refuses
    the read-only reconfigure (EBUSY), the turn writes on, and once it is closed the next
    freeze is made."""
    pid = fork.channel.host_pid()  # type: ignore[attr-defined]
    held = os.open(f"/proc/{pid}/root/workspace/held", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="cannot be frozen") as busy:
            freeze_fork_layer(fork, 8 << 20)
        assert busy.value.errno == errno.EBUSY
        _writes_on(fork)
    finally:
        os.close(held)
    fd, _ = freeze_fork_layer(fork, 8 << 20)
    os.close(fd)
    _writes_on(fork)


def test_a_step_killed_before_its_overlay_leaves_the_fork_writable(
    fork: SandboxSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child killed at the timeout undoes nothing: the container's workspace is the host's
    overlay still, so the host thaws the layer's tmpfs, and the next freeze is made."""
    with monkeypatch.context() as patched:
        patched.setattr(docker_freeze, "_FREEZE_FORK", _HANGS_BEFORE_THE_OVERLAY)
        with pytest.raises(OSError, match="did not end in time") as late:
            freeze_fork_layer(fork, 8 << 20, timeout=2)
    assert late.value.errno == errno.ETIMEDOUT
    assert not isinstance(late.value, LayerLost)
    _writes_on(fork)
    fd, _ = freeze_fork_layer(fork, 8 << 20)
    os.close(fd)


def test_a_step_killed_after_its_overlay_loses_the_layer_and_its_listing(
    fork: SandboxSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed once the new overlay is on the workspace: the turn writes on above a layer the
    host never got (``LayerLost``), and its snapshots read every file (no listing)."""
    monkeypatch.setattr(docker_freeze, "_FREEZE_FORK", _HANGS_AFTER_THE_OVERLAY)
    with pytest.raises(LayerLost, match="its layer is lost") as late:
        freeze_fork_layer(fork, 8 << 20, timeout=2)
    assert late.value.errno == errno.ETIMEDOUT
    _writes_on(fork)
    assert fork.upper_names() is None  # type: ignore[attr-defined]


def test_a_layer_frozen_and_never_sent_is_lost_and_unlisted(
    fork: SandboxSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child laid all and sent no clone: the host says the layer is lost, the turn
    writes on in its new overlay, and its snapshots read every file."""
    monkeypatch.setattr(docker_freeze, "_FREEZE_FORK", _SENDS_NOTHING)
    with pytest.raises(LayerLost, match="sent no clone"):
        freeze_fork_layer(fork, 8 << 20)
    _writes_on(fork)
    assert _sh(fork, "grep -c ' /workspace ' /proc/self/mountinfo") == "2\n"
    assert fork.upper_names() is None  # type: ignore[attr-defined]
