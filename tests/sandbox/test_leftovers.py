"""A host killed outright leaves its temporary folders; the next host process removes them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel._ground import _leftovers

# A host that opens a bubblewrap turn, makes one call (which makes the turn's outbox
# folder), lists its temporary folder, then waits to be killed or closes the turn.
HOST = textwrap.dedent(
    """
    import sys, tempfile, time
    from astralvessel.sandbox import Policy
    from astralvessel.sandbox._base import RunRequest
    from astralvessel.sandbox._discovery import get_backend
    session = get_backend("bubblewrap").start(Policy())
    session.run(RunRequest(argv=["/bin/echo", "hi"], timeout=30.0, output_chars=100))
    print(*sorted(os.listdir(tempfile.gettempdir())), sep="\\n", flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
    session.close()
    """
).replace("import sys,", "import os, sys,")


def host(tmp: Path, mode: str) -> subprocess.Popen[str]:
    """Start the host script with ``tmp`` as its temporary folder."""
    return subprocess.Popen(
        [sys.executable, "-c", HOST, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp)),
    )


def ours(names: list[str]) -> set[str]:
    """The folder names a host made for its turn: its outbox."""
    return {n for n in names if n.startswith("astralvessel-bubblewrap-outbox-")}


def test_a_killed_hosts_folders_go_with_the_next_host(tmp_path: Path) -> None:
    """A SIGKILLed host's outbox folder is removed by the next host's first turn, and that
    host's own goes when it closes its turn."""
    first: set[str] = set()
    with host(tmp_path, "wait") as killed:
        try:
            assert killed.stdout is not None
            while not first:
                line = killed.stdout.readline()
                assert line, "the first host ended before making its folders"
                first |= ours([line.strip()])
        finally:
            killed.send_signal(signal.SIGKILL)
    # Nothing else removes them: the host is dead, its finalizers never ran.
    assert first <= set(os.listdir(tmp_path))
    second = host(tmp_path, "exit")
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0
    seen_by_second = ours(out.split())
    assert len(seen_by_second) == 1  # its own: the dead host's was gone already
    assert not seen_by_second & first
    assert ours(os.listdir(tmp_path)) == set()


# A host whose turn has a network: its first call starts the turn's egress proxy, whose
# folder holds the proxy's socket. Then as HOST.
EGRESS_HOST = textwrap.dedent(
    """
    import os, sys, tempfile, time
    from astralvessel import Executor, Registry, ToolSpec
    echo = ToolSpec.command_tool("echo", "Echo.", ["/bin/echo", "hi"])
    executor = Executor(
        Registry([echo]), sandbox="bubblewrap", network_allow=["example.org"]
    )
    with executor.turn() as turn:
        assert not turn.call("echo", {}).is_error
        print(*sorted(os.listdir(tempfile.gettempdir())), sep="\\n", flush=True)
        if sys.argv[1] == "wait":
            time.sleep(600)
    """
)


def egress_host(tmp: Path, mode: str) -> subprocess.Popen[str]:
    """Start the egress host script with ``tmp`` as its temporary folder."""
    return subprocess.Popen(
        [sys.executable, "-c", EGRESS_HOST, mode],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp)),
    )


def proxies(names: list[str]) -> set[str]:
    """The egress proxy folders among ``names``."""
    return {n for n in names if n.startswith("astralvessel-egress-")}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder in the system's own: pytest's ``tmp_path`` is too long a path for
    the proxy's socket (108 bytes in all)."""
    folder = Path(tempfile.mkdtemp(prefix="lo-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_hosts_egress_folder_goes_with_the_next_hosts_proxy(short_tmp: Path) -> None:
    """A SIGKILLed host's egress proxy folder (named compactly: its socket's path is bounded)
    is removed by the next host's first proxy, and that host's own goes when its turn ends."""
    tmp_path = short_tmp
    first: set[str] = set()
    with egress_host(tmp_path, "wait") as killed:
        try:
            assert killed.stdout is not None
            while not first:
                line = killed.stdout.readline()
                assert line, "the first host ended before starting its proxy"
                first |= proxies([line.strip()])
        finally:
            killed.send_signal(signal.SIGKILL)
    assert first <= set(os.listdir(tmp_path))
    (name,) = first
    assert _leftovers.is_leftover(name, "egress", _leftovers.start_time)
    second = egress_host(tmp_path, "exit")
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0
    seen_by_second = proxies(out.split())
    assert len(seen_by_second) == 1  # its own: the dead host's was gone already
    assert not seen_by_second & first
    assert proxies(os.listdir(tmp_path)) == set()


def test_compact_names_say_their_owner_in_base_36() -> None:
    """A compact name is this process's in base 36; it is judged as a decimal one is, and
    neither form is ever read as the other."""
    prefix = _leftovers.owned_prefix("egress", compact=True)
    started = _leftovers.start_time(os.getpid())
    assert started is not None
    pid36, start36, rest = prefix.removeprefix("astralvessel-egress-").split(".")
    assert (int(pid36, 36), int(start36, 36), rest) == (os.getpid(), int(started), "")
    assert not _leftovers.is_leftover(prefix + "abc", "egress", _leftovers.start_time)
    live = {36: "1296"}.get  # pid "10", start "100" in base 36
    assert not _leftovers.is_leftover("astralvessel-egress-10.100.abc", "egress", live)
    assert _leftovers.is_leftover("astralvessel-egress-10.101.abc", "egress", live)
    assert _leftovers.is_leftover("astralvessel-egress-11.100.abc", "egress", live)
    # The decimal "36-1296" names the same owner; read as base 36 it would be another.
    assert not _leftovers.is_leftover("astralvessel-egress-36-1296-abc", "egress", live)
    for name in (
        "astralvessel-egress-10.100",
        "astralvessel-egress-10.1_0.abc",  # int() takes underscores; a name is never so read
        "astralvessel-egress-A.100.abc",
        "astralvessel-egress-.100.abc",
        "astralvessel-egress-10-100.abc",
    ):
        assert not _leftovers.is_leftover(name, "egress", live), name


def test_only_a_dead_owners_folders_are_leftovers() -> None:
    """A folder is a leftover when its owner's pid is gone or names a process started later."""
    started = {10: "500"}.get
    assert _leftovers.is_leftover("astralvessel-egress-11-500-abc", "egress", started)
    assert _leftovers.is_leftover("astralvessel-egress-10-499-abc", "egress", started)
    assert not _leftovers.is_leftover("astralvessel-egress-10-500-abc", "egress", started)
    for name in (
        "astralvessel-egress-abc12345",  # made before folders named their owner
        "astralvessel-outbox-k3j_x9a2",  # the CLI's outbox, which outlives the CLI on purpose
        "astralvessel-egress-10-abc",
        "astralvessel-egress-x-1-abc",
        "astralvessel-outbox-11-500-abc",  # another kind
        "other-egress-11-500-abc",
    ):
        assert not _leftovers.is_leftover(name, "egress", started), name


def test_leftovers_never_follow_a_link_nor_take_a_live_owners(tmp_path: Path) -> None:
    """Removal takes dead owners' real folders only: a live owner's folder, a link named like
    a leftover and what it points to all stay."""
    dead = tmp_path / "astralvessel-egress-999999999-1-abc"
    (dead / "inner").mkdir(parents=True)
    (dead / "inner" / "file").write_text("x")
    live = tmp_path / (_leftovers.owned_prefix("egress") + "live")
    live.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / "astralvessel-egress-999999998-1-link").symlink_to(target)
    assert _leftovers.remove_leftovers("egress", str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, "target", "astralvessel-egress-999999998-1-link"]
    )
    assert (target / "keep").exists()


def test_a_dead_hosts_tree_with_folders_it_cannot_write_goes(tmp_path: Path) -> None:
    """A dead host's snapshot tree keeps the folder modes a sandbox made (0555 among them):
    the sweep gives the owner its bits back rather than leave the tree for good (an ordinary
    user's rmtree alone cannot empty such a folder; the unprivileged CI session runs this)."""
    dead = tmp_path / "astralvessel-snapshots-999999999-1-abc"
    locked = dead / "tree" / "locked"
    (locked / "deeper").mkdir(parents=True)
    (locked / "deeper" / "file").write_text("x")
    (locked / "file").write_text("x")
    (locked / "deeper").chmod(0o555)
    locked.chmod(0o555)
    assert _leftovers.remove_leftovers("snapshots", str(tmp_path)) == 1
    assert not dead.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root host stages frozen layers")
def test_a_dead_root_hosts_store_is_unmounted_before_it_goes(tmp_path: Path) -> None:
    """A root host stages frozen layers in its store (a private mount of its own, each
    layer a read-only tmpfs under it): the sweep detaches them, then removes the folder."""
    from astralvessel._ground import _mounts

    store = tmp_path / "astralvessel-snapshots-4194303-1-dead"
    tree = store / "tmpx" / "tree"
    tree.mkdir(parents=True)
    _mounts.make_private(str(store))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "none", str(tree)], check=True)
    (tree / "f").write_bytes(b"layer")
    subprocess.run(["mount", "-o", "remount,ro", str(tree)], check=True)
    assert _mounts.mounts_under(str(store)) == [str(tree), str(store)]
    assert _leftovers.remove_leftovers("snapshots", str(tmp_path)) == 1
    assert _mounts.mounts_under(str(store)) == []
    assert not store.exists()


_PROPAGATION = textwrap.dedent(
    """
    import os, subprocess, sys
    from astralvessel._ground import _mounts
    base = sys.argv[1]
    subprocess.run(["mount", "-t", "tmpfs", "none", base], check=True)
    subprocess.run(["mount", "--make-shared", base], check=True)
    store = os.path.join(base, "store")
    os.mkdir(store)
    print(_mounts.propagates(store), _mounts.propagates(base + "/elsewhere"))
    _mounts.make_private(store)
    print(_mounts.propagates(store + "/tree"), _mounts.propagates(base + "/elsewhere"))
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts of one's own need root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_store_on_a_shared_mount_is_made_private(tmp_path: Path) -> None:
    """On a shared mount (systemd's ``/``) a layer staged in the store would propagate to
    every peer and slave namespace: the store is made a private mount of its own first.
    Run in a mount namespace of its own, whose mounts go with it."""
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _PROPAGATION,
         str(tmp_path)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert done.stdout.split() == ["True", "True", "False", "True"]
