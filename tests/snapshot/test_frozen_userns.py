"""A frozen layer made as a sandbox's server makes one, in a user namespace of its own,
opens turns as root; an ordinary user's host holds one by its descriptor (``nox -s
unprivileged`` runs this as one).

As root the host stages the layer in its store and the server lays its overlay on it
(an idmapped clone: root holds every capability over the layer's namespace). An
ordinary user cannot mount in the host's namespace: the snapshot's tree keeps the
layer's descriptor, read through ``/proc/self/fd`` and closed when the last snapshot
goes (its forks get the descriptor itself: ``test_frozen_fork``).
"""

from __future__ import annotations

import gc
import io
import os
from pathlib import Path

import pytest

from astralvessel import Executor, Registry, TurnSnapshot
from astralvessel._executor._snapshot._freeze import snapshot_frozen
from astralvessel._executor._snapshot._store import Budget

from .frozen import closed, layer_of_another_namespace


def test_an_ordinary_user_holds_a_layer_by_its_descriptor() -> None:
    if os.geteuid() == 0:
        pytest.skip("as root the layer is staged")
    fd = layer_of_another_namespace({"kept": b"kept\n"})
    device = os.fstat(fd).st_dev
    budget = Budget(1 << 30)
    snapshot = snapshot_frozen(fd, budget=budget, max_bytes=1 << 30, max_files=100)
    assert snapshot.held_layer == fd
    assert snapshot.path == Path(f"/proc/self/fd/{fd}")
    assert (snapshot.path / "kept").read_bytes() == b"kept\n"
    assert budget.used_bytes == 5
    saved = io.BytesIO()
    snapshot.save(saved)
    assert TurnSnapshot.load(io.BytesIO(saved.getvalue())) == snapshot
    del snapshot
    gc.collect()
    assert budget.used_bytes == 0
    assert closed(fd, device)  # with the last snapshot


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
