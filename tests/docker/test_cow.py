"""A Docker turn opened from a snapshot copy-on-write: the host's overlay, bound as the workspace.

The conformance suite's snapshot tests (test_snapshots.py, test_snapshot_reuse.py)
run the attacks on it: the lower tree never changes, siblings stay apart,
disk_mb bounds the upper layer, a fork's snapshot reads what it changed however
it changed it. These check what is Docker's own: the container binds the host's
overlay in place of its tmpfs, the host reads the upper layer's names for a
snapshot, and the host's mounts go with the turn, or with the next host when
the one that made them died.
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from astralvessel import Executor, Registry
from astralvessel._ground._leftovers import owned_prefix
from astralvessel.sandbox import FsReply, FsRequest, Limits, Policy, RunRequest
from astralvessel.sandbox._session import ServerSession
from astralvessel.sandbox.docker import Docker
from astralvessel.sandbox.docker._cow import HostOverlay, remove_frames
from astralvessel.sandbox.docker._spec import container_spec
from astralvessel.sandbox.server._snapfiles import UPPER_DEPTH

from .conftest import SMALL_LIMITS


def _frames(prefix: str | None = None) -> list[str]:
    """The host's mount points of frames whose names start with ``prefix`` (None: this
    process's own, not those of other hosts testing on this machine at the same time), as
    this process's mount namespace shows them."""
    start = owned_prefix("cow") if prefix is None else prefix
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [point for point in points if Path(point).name.startswith(start)]


def _tree(tmp_path: Path) -> Path:
    """A snapshot's tree as the store holds it: the host's files, not the calls'."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_text("base\n")
    for path in (tmp_path, tree, tree / "d"):
        path.chmod(0o755)
    return tree


def test_the_hosts_overlay_is_bound_in_place_of_the_workspace_tmpfs():
    """With ``workspace``, /workspace is a bind of the host's folder, never a tmpfs too."""
    spec = container_spec(
        Policy(), image="img", command=["python3", "-c", "x"], seccomp_profile="{}",
        labels={}, server=True, workspace="/host/frame/workspace",
    )  # fmt: skip
    assert "/host/frame/workspace:/workspace:rw" in spec.host_config["binds"]  # type: ignore[operator]
    assert "/workspace" not in spec.host_config["tmpfs"]  # type: ignore[operator]


def test_a_turn_on_a_snapshots_tree_runs_on_the_hosts_overlay(backend: Docker, tmp_path: Path):
    """As root the workspace is the host's overlay: the calls own the tree's files, write
    them without changing the tree, and the overlay's frame goes when the turn closes."""
    assert os.geteuid() == 0, "the host mounts the overlay as root only"
    tree = _tree(tmp_path)
    before = set(_frames())
    session = backend.start(Policy(limits=SMALL_LIMITS, workspace_lower=tree))
    try:
        assert session.ready_info["relaxations"]["workspace_lower"] is True  # type: ignore[attr-defined]
        (frame,) = set(_frames()) - before
        script = (
            "grep ' /workspace ' /proc/self/mountinfo | cut -d' ' -f6,9; "
            'test "$(stat -c %u /workspace/d/f)" = "$(id -u)" && echo mine; '
            "echo more >> /workspace/d/f && cat /workspace/d/f && rm /workspace/d/f && ls /workspace/d"
        )
        outcome = session.run(RunRequest(argv=("sh", "-c", script), timeout=30, output_chars=4000))
        options, kind = outcome.output.splitlines()[0].split()
        assert kind == "overlay"
        assert {"rw", "nosuid", "nodev"} <= set(options.split(","))
        assert outcome.output.splitlines()[1:] == ["mine", "base", "more"]
    finally:
        session.close()
    assert (tree / "d" / "f").read_text() == "base\n"
    assert set(_frames()) == before
    assert not Path(frame).exists()


def test_a_snapshot_listing_carries_the_upper_layers_names(backend: Docker, tmp_path: Path):
    """The host reads the names the turn's upper layer holds, once the listing is in: a
    file written, one removed (a whiteout), a folder made anew (opaque) and its parent
    are there; a file untouched is not, nor is anything once the turn is closed."""
    assert os.geteuid() == 0, "the host mounts the overlay as root only"
    tree = _tree(tmp_path)
    (tree / "keep").write_text("kept\n")
    (tree / "d" / "gone").write_text("gone\n")
    (tree / "e").mkdir(mode=0o755)
    (tree / "e" / "old").write_text("old\n")
    session = backend.start(Policy(limits=SMALL_LIMITS, workspace_lower=tree))
    listing = FsRequest(op="pack", timeout=30, fields={"phase": "list"})
    try:
        script = (
            "cd /workspace && echo more >> d/f && rm d/gone && rm -r e && mkdir e && echo n > new"
        )
        outcome = session.run(RunRequest(argv=("sh", "-c", script), timeout=30, output_chars=4000))
        assert outcome.exit_code == 0, outcome.output
        reply = session.fs(listing)
        assert reply.errno is None
        assert reply.upper_names is not None
        assert {b"d", b"d/f", b"d/gone", b"e", b"new"} <= reply.upper_names
        assert not {b"keep", b"e/old"} & reply.upper_names
        unmarked = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert unmarked.upper_names is None  # a listing of the file tools, not a snapshot's
    finally:
        session.close()
    assert session.upper_names is not None  # type: ignore[attr-defined]
    assert session.upper_names() is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_forks_snapshot_reads_only_what_the_fork_changed(
    backend: Docker, monkeypatch: pytest.MonkeyPatch, twin: str
):
    """A fork's snapshot links every file its upper layer does not hold to the tree it
    opened from (one inode; a fresh turn's frozen layer: to the layer's copy in the store)
    and asks the sandbox for the bytes of the one it wrote alone, through ``snapshot`` as
    through ``asnapshot``."""
    assert os.geteuid() == 0, "the host mounts the overlay as root only"
    read: list[int] = []
    fs, afs = ServerSession.fs, ServerSession.afs

    def count(request: FsRequest, reply: FsReply) -> FsReply:
        if request.op == "pack" and request.fields.get("phase") == "read":
            read.append(len(reply.data))
        return reply

    def counted(session: ServerSession, request: FsRequest) -> FsReply:
        return count(request, fs(session, request))

    async def acounted(session: ServerSession, request: FsRequest) -> FsReply:
        return count(request, await afs(session, request))

    monkeypatch.setattr(ServerSession, "fs", counted)
    monkeypatch.setattr(ServerSession, "afs", acounted)
    make = "cd /workspace && mkdir d && for i in $(seq 50); do printf file-$i > d/$i; done"
    with Executor(Registry([]), sandbox=backend, limits=SMALL_LIMITS) as executor:
        with executor.turn() as parent:
            assert parent.exec(["sh", "-c", make]).returncode == 0
            (fork,) = parent.fork(1)
        source = fork.snapshot_source
        assert source is not None
        with fork:
            assert fork.exec(["sh", "-c", "printf changed > /workspace/d/7"]).returncode == 0
            read.clear()
            taken = fork.snapshot() if twin == "sync" else asyncio.run(fork.asnapshot())
    assert sum(read) == len(b"changed")
    assert (taken.path / "d/7").read_bytes() == b"changed"
    linked = source.path
    if source.layer is not None:  # frozen: another filesystem, linked from its store copy
        assert source.layer.copy is not None
        linked = source.layer.copy.path
    for index in range(1, 51):
        same = os.stat(taken.path / f"d/{index}").st_ino == os.stat(linked / f"d/{index}").st_ino
        assert same is (index != 7)


def test_a_writable_root_turn_is_given_the_files_by_copy(backend: Docker, tmp_path: Path):
    """The root's layers live in the workspace's own tmpfs: no host overlay, no frame."""
    before = set(_frames())
    roomy = Limits(disk_mb=64, memory_mb=256, processes=48, open_files=256)
    session = backend.start(
        Policy(limits=roomy, workspace_lower=_tree(tmp_path), writable_root=True)
    )
    try:
        assert "workspace_lower" not in (session.ready_info.get("relaxations") or {})  # type: ignore[attr-defined]
        assert set(_frames()) == before
    finally:
        session.close()


def test_a_dead_hosts_frame_is_swept(tmp_path: Path):
    """A host killed with its overlay mounted leaves the frame; the next one unmounts it
    (every layer with it) and removes the folder, and the tree is as it was.

    An ordinary user cannot mount: the overlay is refused and leaves no folder behind."""
    tree = _tree(tmp_path)
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            HostOverlay(str(tree), os.getuid(), os.getgid(), Limits(disk_mb=4))
        assert not list(Path(tempfile.gettempdir()).glob(f"{owned_prefix('cow')}*"))
        return
    code = textwrap.dedent(
        f"""
        import os
        from astralvessel.sandbox import Limits
        from astralvessel.sandbox.docker._cow import HostOverlay
        overlay = HostOverlay({str(tree)!r}, 4242420, 4242420, Limits(disk_mb=4))
        print(overlay.frame, flush=True)
        os._exit(0)  # as a killed host: nothing closed
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    frame = done.stdout.strip()
    assert frame in _frames("astralvessel-cow-")
    assert remove_frames() >= 1
    assert frame not in _frames("astralvessel-cow-")
    assert not Path(frame).exists()
    assert (tree / "d" / "f").read_text() == "base\n"


def test_an_upper_layer_too_deep_or_past_the_descriptors_is_unknown(
    backend: Docker, tmp_path: Path
):
    """The host's reading of a layer nested 900 folders deep gives up (None), the listing
    says so (upper_read False, no name) and nothing of the host's is held open for it;
    with no descriptor left to copy the layer's, it is unknown too, never an error."""
    assert os.geteuid() == 0, "the host mounts the overlay as root only"
    assert UPPER_DEPTH < 900
    tree = _tree(tmp_path)
    session = backend.start(Policy(limits=SMALL_LIMITS, workspace_lower=tree))
    try:
        deep = "/".join(["d"] * 900)
        script = f"cd /workspace && mkdir -p {deep} && echo bottom > {deep}/f"
        outcome = session.run(RunRequest(argv=("sh", "-c", script), timeout=30, output_chars=4000))
        assert outcome.exit_code == 0, outcome.output
        overlay_names = session.upper_names  # type: ignore[attr-defined]
        before = len(os.listdir("/proc/self/fd"))
        assert overlay_names() is None
        assert len(os.listdir("/proc/self/fd")) == before
        reply = session.fs(FsRequest(op="pack", timeout=30, fields={"phase": "list"}))
        assert reply.errno is None
        assert (reply.upper_names, reply.upper_read) == (frozenset(), False)
        lowest = os.dup(0)
        os.close(lowest)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
        try:
            unknown = overlay_names()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert unknown is None
    finally:
        session.close()
