"""A snapshot's tree reaches a sandbox by path only: the layout never binds a path in
``/proc`` (a descriptor's ``/proc/self/fd/N``, above all: bubblewrap binds a path by its
text, and a detached mount's reads "/", the host's root), and a refused overlay leaves
no layers folder behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel.errors import UsageError
from astralvessel.sandbox._base import ServerOptions
from astralvessel.sandbox._hostinfo import collect_host_facts
from astralvessel.sandbox._layout import Bind, sandbox_layout
from astralvessel.sandbox._policy import WORKSPACE_LOWER_DIR, Policy
from astralvessel.sandbox._server_hello import hello_message
from astralvessel.sandbox.server import _lowerfs
from astralvessel.sandbox.server._messages import Hello


@pytest.mark.parametrize("lower", ["/proc/self/fd/7", "/proc/1234/fd/3", "/proc/self/root"])
def test_a_path_in_proc_is_never_bound_as_the_lower_layer(lower: str) -> None:
    facts = collect_host_facts()
    with pytest.raises(UsageError, match="/proc"):
        sandbox_layout(Policy(workspace_lower=lower), facts)


def test_a_tree_in_the_store_is_bound_by_its_path() -> None:
    facts = collect_host_facts()
    steps = sandbox_layout(Policy(workspace_lower="/tmp/store/tree"), facts)
    binds = [s for s in steps if isinstance(s, Bind) and s.target == str(WORKSPACE_LOWER_DIR)]
    assert [b.source for b in binds] == ["/tmp/store/tree"]


def test_a_held_layer_is_passed_by_descriptor_never_bound() -> None:
    """An ordinary user's frozen layer (a descriptor the host holds) binds nothing: the
    launcher passes the descriptor, and the hello names its number."""
    facts = collect_host_facts()
    policy = Policy(workspace_lower_fd=7)
    steps = sandbox_layout(policy, facts)
    assert not [s for s in steps if isinstance(s, Bind) and s.target == str(WORKSPACE_LOWER_DIR)]
    options = ServerOptions(confine=True)
    hello = hello_message(policy, options, file_worker_idle=30.0)
    assert (hello.workspace_lower, hello.workspace_lower_fd) == (None, 7)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"workspace_lower_fd": -1}, "a descriptor's number"),
        ({"workspace_lower_fd": True}, "a descriptor's number"),
        ({"workspace_lower_fd": 3, "workspace_lower": "/tmp/tree"}, "not both"),
    ],
)
def test_a_bad_lower_descriptor_is_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        Policy(**fields)  # type: ignore[arg-type]


def test_the_server_refuses_a_hello_with_both_lowers() -> None:
    header = hello_message(Policy(), ServerOptions(confine=True), file_worker_idle=30.0).to_json()
    header.update(workspace_lower="/tmp/x", workspace_lower_fd=3)
    with pytest.raises(ValueError, match="workspace_lower_fd"):
        Hello.from_json(header)


def test_a_refused_overlay_leaves_no_layers_folder(tmp_path: Path) -> None:
    """The overlay makes ``work/work`` before it may refuse (EPERM over a frozen layer of
    another user namespace, as an ordinary user): the folder goes all the same, or the
    workspace would hold a private folder no snapshot of it can list."""
    layers = tmp_path / _lowerfs.LAYERS
    for name in ("upper", "work/work", "work/index"):
        (layers / name).mkdir(parents=True)
    _lowerfs._undo(str(layers))
    assert not layers.exists()
