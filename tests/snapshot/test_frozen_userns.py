"""A frozen layer made as a sandbox's server makes one, in a user namespace of its own,
opens turns as root and as an ordinary user (``nox -s unprivileged`` runs this as one).

As root the server lays its overlay on the layer (an idmapped clone: root holds every
capability over the layer's namespace); as an ordinary user the kernel refuses an
overlay, in one sandbox's user namespace, over a tmpfs of another's (EPERM), and the
turn opens by copy, as it does wherever the overlay cannot be laid.
"""

from __future__ import annotations

import os

import pytest

from astralvessel import Executor, Registry
from astralvessel._executor._snapshot._freeze import snapshot_frozen
from astralvessel._executor._snapshot._store import Budget

from .frozen import layer_of_another_namespace


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
        overlay = b" /workspace rw,nosuid,nodev,relatime - overlay " in mounts
        assert overlay is (os.geteuid() == 0)
        assert b"vessel-lower" not in mounts
        later = turn.snapshot()
    assert (later.path / "changed").read_bytes() == b"before\nafter\n"
    assert (source.path / "changed").read_bytes() == b"before\n"
