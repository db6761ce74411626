"""A frozen layer made as a sandbox's server makes one, in a user namespace of its own,
opens turns as root; an ordinary user's host cannot stage one (``nox -s unprivileged``
runs this as one).

As root the host stages the layer in its store and the server lays its overlay on it
(an idmapped clone: root holds every capability over the layer's namespace). An
ordinary user cannot mount in the host's namespace, so the layer is refused and its
descriptor closed (a fork of such a host's turn is never frozen: ``freezes_here``).
"""

from __future__ import annotations

import os

import pytest

from astralvessel import Executor, Registry, SnapshotError
from astralvessel._executor._snapshot._freeze import snapshot_frozen
from astralvessel._executor._snapshot._store import Budget

from .frozen import layer_of_another_namespace


def test_an_ordinary_user_cannot_stage_a_layer() -> None:
    if os.geteuid() == 0:
        pytest.skip("as root the layer is staged")
    fd = layer_of_another_namespace({"kept": b"kept\n"})
    with pytest.raises(SnapshotError, match="cannot be staged"):
        snapshot_frozen(fd, budget=Budget(1 << 30), max_bytes=1 << 30, max_files=100)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's host stages a frozen layer")
@pytest.mark.parametrize("backend", ["bubblewrap", "nsjail"])
def test_a_layer_of_another_namespace_opens_a_turn(backend: str) -> None:
    files = {"kept": b"kept\n", "changed": b"before\n"}
    source = snapshot_frozen(
        layer_of_another_namespace(files), budget=Budget(1 << 30), max_bytes=1 << 30,
        max_files=100,
    )  # fmt: skip
    with Executor(Registry(), sandbox=backend) as executor, executor.turn(snapshot=source) as turn:
        result = turn.exec(["/bin/sh", "-c", "cd /workspace && echo after >> changed && cat *"])
        assert result.stdout == b"before\nafter\nkept\n", result.stderr
        mounts = turn.exec(["cat", "/proc/self/mountinfo"]).stdout
        assert b" /workspace rw,nosuid,nodev,relatime - overlay " in mounts
        later = turn.snapshot()
    assert (later.path / "changed").read_bytes() == b"before\nafter\n"
    assert (source.path / "changed").read_bytes() == b"before\n"
