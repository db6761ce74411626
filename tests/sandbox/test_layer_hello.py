"""A frozen layer reaches the server by descriptor: how the hello names it, what a probe
keys on, and how the server reads the name (``Policy.workspace_layer``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from astralvessel.errors import UsageError
from astralvessel.sandbox._base import ServerOptions
from astralvessel.sandbox._hostinfo import collect_host_facts
from astralvessel.sandbox._layout import Bind, sandbox_layout
from astralvessel.sandbox._policy import WORKSPACE_LOWER_DIR, Policy
from astralvessel.sandbox._server_hello import hello_message, known_probe
from astralvessel.sandbox.server import _lowerfs


class _Owner:
    """Owns a descriptor, as a frozen layer's tree does."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def _lower(policy: Policy) -> str | None:
    options = ServerOptions(confine=True)
    return hello_message(policy, options, file_worker_idle=30.0).workspace_lower


def test_the_hello_names_the_layer_by_its_number() -> None:
    assert _lower(Policy(workspace_layer=_Owner(7))) == "/proc/self/fd/7"
    assert _lower(Policy(workspace_lower="/store/tree")) == str(WORKSPACE_LOWER_DIR)
    assert _lower(Policy()) is None


def test_the_probe_is_the_same_whichever_number_the_layer_has() -> None:
    options = ServerOptions(confine=True)
    hellos = [
        hello_message(Policy(workspace_layer=_Owner(fd)), options, file_worker_idle=30.0)
        for fd in (7, 9)
    ]
    keys = {known_probe({}, "bwrap", hello)[0] for hello in hellos}
    assert len(keys) == 1
    plain = hello_message(Policy(), options, file_worker_idle=30.0)
    assert known_probe({}, "bwrap", plain)[0] not in keys


def test_the_layer_is_never_bound_by_path() -> None:
    """bubblewrap binds a path by its text: a detached mount's ``/proc/self/fd/N`` reads
    "/", and would bind the host's root."""
    facts = collect_host_facts()
    steps = sandbox_layout(Policy(workspace_layer=_Owner(7)), facts)
    assert not [s for s in steps if isinstance(s, Bind) and "/proc/self/fd" in s.source]
    assert not [s for s in steps if isinstance(s, Bind) and s.target == str(WORKSPACE_LOWER_DIR)]


def test_a_layer_must_own_a_descriptor() -> None:
    with pytest.raises(UsageError, match="fileno"):
        Policy(workspace_layer=7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lower", "fd"),
    [("/proc/self/fd/12", 12), ("/.vessel-lower", None), ("/proc/self/fd/", None),
     ("/proc/self/fd/1/x", None)],
)  # fmt: skip
def test_the_server_reads_the_layers_number(lower: str, fd: int | None) -> None:
    assert _lowerfs.layer_fd(lower) == fd


def test_the_server_closes_the_layer_once_used() -> None:
    read, write = os.pipe()
    os.close(write)
    _lowerfs.release_layer(f"/proc/self/fd/{read}")
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read)
    _lowerfs.release_layer("/.vessel-lower")  # a bound tree: nothing to close


def test_a_refused_overlay_leaves_no_layers_folder(tmp_path: Path) -> None:
    """The overlay makes ``work/work`` before it may refuse (EPERM over a frozen layer of
    another user namespace, as an ordinary user): the folder goes all the same, or the
    workspace would hold a private folder no snapshot of it can list."""
    layers = tmp_path / _lowerfs.LAYERS
    for name in ("upper", "work/work", "work/index"):
        (layers / name).mkdir(parents=True)
    _lowerfs._undo(str(layers))
    assert not layers.exists()
