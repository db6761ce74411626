"""A stack of frozen layers (a fork of a fork's, ``Policy.workspace_layers``) reaches a
sandbox as binds, one per layer, top first, and nothing else (an ordinary user's, held:
``Policy.workspace_below_fds``, as descriptors); bogus stacks are refused by the host's
policy and by the server's hello, and the host's merged view of a held stack takes
detached mounts only; a freeze of a fork's own layer is refused
where the workspace is no such fork's; the host's overlay of the stack refuses a path
its options would split on."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel._executor._snapshot._heldmerge import merged_view
from astralvessel._executor._snapshot._store import mount_stack
from astralvessel._ground import _mounts
from astralvessel.errors import UsageError
from astralvessel.sandbox import Limits, Policy, SandboxSession
from astralvessel.sandbox._api import FsRequest, RunRequest
from astralvessel.sandbox._base import ServerOptions
from astralvessel.sandbox._bwrap import Bubblewrap
from astralvessel.sandbox._frozen import freeze, freeze_fork_layer
from astralvessel.sandbox._hostinfo import collect_host_facts
from astralvessel.sandbox._layout import Bind, sandbox_layout
from astralvessel.sandbox._nsjail import Nsjail
from astralvessel.sandbox._policy import WORKSPACE_LOWER_DIR
from astralvessel.sandbox._server_hello import hello_message
from astralvessel.sandbox.server import _lowerfs
from astralvessel.sandbox.server._messages import MAX_LAYERS, Freeze, Hello

BACKENDS = {"bubblewrap": Bubblewrap, "nsjail": Nsjail}


def test_each_layer_is_bound_in_order_and_the_hello_counts_them() -> None:
    layers = ("/tmp/store/a/tree", "/tmp/store/b/tree", "/tmp/store/c/tree")
    policy = Policy(workspace_layers=layers)
    steps = sandbox_layout(policy, collect_host_facts())
    binds = [
        s for s in steps if isinstance(s, Bind) and s.target.startswith(str(WORKSPACE_LOWER_DIR))
    ]
    assert [(b.source, b.target, b.writable) for b in binds] == [
        (layer, f"{WORKSPACE_LOWER_DIR}/{index}", False) for index, layer in enumerate(layers)
    ]
    hello = hello_message(policy, ServerOptions(confine=True), file_worker_idle=30.0)
    assert (hello.workspace_lower, hello.workspace_layers) == (str(WORKSPACE_LOWER_DIR), 3)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"workspace_layers": ["/tmp/t"] * (MAX_LAYERS + 1)}, "at most"),
        ({"workspace_layers": ["/tmp/a"], "workspace_lower": "/tmp/b"}, "not two"),
        ({"workspace_layers": ["/tmp/a"], "workspace_lower_fd": 3}, "not two"),
    ],
)
def test_a_bad_stack_is_refused_by_the_policy(fields: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        Policy(**fields)  # type: ignore[arg-type]


def test_a_layer_in_proc_is_never_bound() -> None:
    with pytest.raises(UsageError, match="/proc"):
        sandbox_layout(Policy(workspace_layers=["/tmp/a", "/proc/self/fd/3"]), collect_host_facts())


@pytest.mark.parametrize(
    "fields",
    [
        {"workspace_layers": 2},  # no lower to find them in
        {"workspace_layers": -1, "workspace_lower": "/x"},
        {"workspace_layers": MAX_LAYERS + 1, "workspace_lower": "/x"},
    ],
)
def test_the_server_refuses_a_bogus_stack_in_a_hello(fields: dict[str, object]) -> None:
    header = hello_message(Policy(), ServerOptions(confine=True), file_worker_idle=30.0).to_json()
    header.update(fields)
    with pytest.raises(ValueError, match="workspace_layers"):
        Hello.from_json(header)


def test_a_stack_message_field_is_checked() -> None:
    with pytest.raises(TypeError, match="stack"):
        Freeze.from_json({"type": "freeze", "op": "freeze", "upper_bytes": 1, "stack": "yes"})


def test_the_server_refuses_layers_it_cannot_lay(tmp_path: Path) -> None:
    """A stack whose folders are missing is refused and leaves no layers folder."""
    workspace = tmp_path / "ws"
    (tmp_path / "lower").mkdir()
    workspace.mkdir()
    with pytest.raises(OSError, match="No such file"):
        _lowerfs.overlay_workspace(str(workspace), str(tmp_path / "lower"), 1234, 1234, layers=2)
    assert os.listdir(workspace) == []
    with pytest.raises(OSError, match="1 to") as refused:
        _lowerfs.overlay_workspace(str(workspace), None, None, None, layers=1)
    assert refused.value.errno == errno.EINVAL


@pytest.mark.skipif(os.geteuid() != 0, reason="root mounts the stack")
@pytest.mark.parametrize("char", [":", ",", "\\"])
def test_the_hosts_overlay_refuses_a_path_its_options_split_on(tmp_path: Path, char: str) -> None:
    with pytest.raises(OSError, match="split on") as refused:
        mount_stack((tmp_path / f"a{char}b", tmp_path / "c"), userxattr=False)
    assert refused.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="two at least"):
        mount_stack((tmp_path,), userxattr=False)


@pytest.fixture(params=sorted(BACKENDS))
def session(request: pytest.FixtureRequest) -> Iterator[SandboxSession]:
    started = BACKENDS[request.param]().start(Policy(limits=Limits(disk_mb=64)))
    try:
        yield started
    finally:
        started.close()


def test_a_fresh_turn_refuses_a_fork_layer_freeze(session: SandboxSession) -> None:
    """No overlay laid at hello on the host's layers: nothing changes, the turn writes on,
    and its own freeze is still what it was."""
    run = RunRequest(argv=("sh", "-c", "echo a > a && cat a"), timeout=30, output_chars=100)
    assert session.run(run).output == "a\n"
    with pytest.raises(OSError, match="overlay") as refused:
        freeze_fork_layer(session, 8 << 20)
    assert refused.value.errno == errno.EOPNOTSUPP
    reply = session.fs(FsRequest(op="freeze", timeout=10, fields={"upper_bytes": 1, "stack": True}))
    assert getattr(errno, reply.errno or "") == errno.EOPNOTSUPP
    assert session.run(run).output == "a\n"
    if os.geteuid() == 0:
        os.close(freeze(session, 8 << 20))
        assert session.run(run).output == "a\n"


def _layers(base: Path, space: str) -> tuple[Path, Path]:
    """A top layer over a bottom one: ``gone`` whited out (a 0/0 character device), ``d``
    opaque by an attribute of ``space``, ``e`` opaque by the other space's (no meaning)."""
    top, bottom = base / "top", base / "bottom"
    for layer in (top, bottom):
        (layer / "d").mkdir(parents=True)
        (layer / "e").mkdir()
    for name in ("gone", "kept", "d/below", "e/below"):
        (bottom / name).write_bytes(b"below\n")
    (top / "d" / "above").write_bytes(b"above\n")
    os.mknod(top / "gone", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    other = "user" if space == "trusted" else "trusted"
    os.setxattr(top / "d", f"{space}.overlay.opaque", b"y")
    os.setxattr(top / "e", f"{other}.overlay.opaque", b"y")
    return top, bottom


@pytest.mark.skipif(os.geteuid() != 0, reason="root mounts the stack")
@pytest.mark.parametrize("userxattr", [False, True])
def test_the_hosts_overlay_reads_the_layers_in_the_forks_attribute_mode(
    tmp_path: Path, userxattr: bool
) -> None:
    """A whiteout hides the name below; an opaque folder of the mode the fork's overlay
    wrote hides what is below it; one of the other mode means nothing."""
    top, bottom = _layers(tmp_path, "user" if userxattr else "trusted")
    merged = mount_stack((top, bottom), userxattr=userxattr)
    try:
        assert sorted(os.listdir(merged)) == ["d", "e", "kept"]
        assert os.listdir(merged / "d") == ["above"]
        assert os.listdir(merged / "e") == ["below"]
        with pytest.raises(OSError, match="Read-only"):
            (merged / "new").write_bytes(b"x")
    finally:
        _mounts.unmount(str(merged))
        shutil.rmtree(merged.parent)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"workspace_below_fds": (4,)}, "missing"),
        ({"workspace_lower_fd": 3, "workspace_below_fds": (-1,)}, "numbers"),
        ({"workspace_lower_fd": 3, "workspace_below_fds": (True,)}, "numbers"),
        ({"workspace_lower_fd": 3, "workspace_below_fds": (4, 3)}, "twice"),
        ({"workspace_lower_fd": 3, "workspace_below_fds": (4, 4)}, "twice"),
        (
            {"workspace_lower_fd": 3, "workspace_below_fds": tuple(range(4, 4 + MAX_LAYERS))},
            "fewer",
        ),
    ],
)
def test_a_bogus_held_stack_is_refused_by_the_policy(fields: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        Policy(**fields)  # type: ignore[arg-type]


def test_a_held_stack_reaches_the_hello_top_first() -> None:
    policy = Policy(workspace_lower_fd=7, workspace_below_fds=(9, 8))
    hello = hello_message(policy, ServerOptions(confine=True), file_worker_idle=30.0)
    assert (hello.workspace_lower_fd, hello.workspace_below_fds) == (7, [9, 8])
    assert Hello.from_json(hello.to_json()) == hello


@pytest.mark.parametrize(
    "fields",
    [
        {"workspace_below_fds": [4]},  # no top layer
        {"workspace_lower_fd": 3, "workspace_below_fds": [-4]},
        {"workspace_lower_fd": 3, "workspace_below_fds": [3]},
        {"workspace_lower_fd": 3, "workspace_below_fds": [4, 4]},
        {"workspace_lower_fd": 3, "workspace_below_fds": list(range(4, 4 + MAX_LAYERS))},
    ],
)
def test_the_server_refuses_a_bogus_held_stack_in_a_hello(fields: dict[str, object]) -> None:
    header = hello_message(Policy(), ServerOptions(confine=True), file_worker_idle=30.0).to_json()
    header.update(fields)
    with pytest.raises(ValueError, match="workspace_below_fds"):
        Hello.from_json(header)
    with pytest.raises(TypeError, match="workspace_below_fds"):
        Hello.from_json({**header, "workspace_below_fds": ["4"]})


def test_the_server_refuses_a_held_stack_it_cannot_lay(tmp_path: Path) -> None:
    """Held layers with a bound lower, or past the bound, are refused before anything is
    made; layers that are no detached mounts are refused, and no layers folder is left."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(OSError, match="held stack") as refused:
        _lowerfs.overlay_workspace(str(workspace), str(tmp_path), None, None, held=3, below=(4,))
    assert refused.value.errno == errno.EINVAL
    with pytest.raises(OSError, match="held stack"):
        _lowerfs.overlay_workspace(
            str(workspace), None, None, None, held=3, below=tuple(range(4, 4 + MAX_LAYERS))
        )
    assert os.listdir(workspace) == []
    if os.geteuid() != 0:  # root may clone a folder of its own namespace
        folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(OSError, match="open_tree"):
                _lowerfs.overlay_workspace(
                    str(workspace), None, None, None, held=folder, below=(folder,)
                )
        finally:
            os.close(folder)
        assert os.listdir(workspace) == []


def test_the_merged_view_refuses_what_is_no_held_layer(tmp_path: Path) -> None:
    """The host's merged view of a held stack is made of detached mounts only: a folder of
    the host's, a file, a closed descriptor are each refused with the kernel's reason, and
    nothing is left open."""
    (tmp_path / "f").write_bytes(b"x")
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    regular = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError, match="two at least"):
            merged_view((folder,))
        for layers in ((folder, folder), (folder, regular), (regular, folder)):
            with pytest.raises(OSError, match="clone a held layer"):
                merged_view(layers)
        spare = os.dup(regular)
        os.close(spare)
        with pytest.raises(OSError, match="clone a held layer"):
            merged_view((folder, spare))
        assert set(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(folder)
        os.close(regular)
