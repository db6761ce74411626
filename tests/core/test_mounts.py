"""Mount: every way of building one checks the same invariants."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from astralvessel import UsageError
from astralvessel.sandbox import Mount


def test_direct_construction_checks_the_target(tmp_path: Path) -> None:
    """Mount(...) refuses a relative or reserved sandbox path, as from_pair does."""
    for target in ("data", "/workspace", "/usr/lib", "/", "/data/../etc"):
        with pytest.raises(UsageError, match="sandbox path"):
            Mount(source=tmp_path, target=target)


def test_direct_construction_checks_the_source(tmp_path: Path) -> None:
    """Mount(...) refuses a host path that does not exist, and resolves one that does."""
    with pytest.raises(UsageError, match="does not exist"):
        Mount(source=tmp_path / "missing", target="/data")
    mount = Mount(source=tmp_path / "." / ".", target="/data")
    assert mount.source == tmp_path.resolve()


def test_evolve_cannot_skip_the_checks(tmp_path: Path) -> None:
    """attrs.evolve runs the same validators as the constructor (a wrong type is a TypeError)."""
    mount = Mount.from_pair("/data", tmp_path)
    with pytest.raises(UsageError, match="reserved"):
        attrs.evolve(mount, target="/agent")
    with pytest.raises(TypeError):
        attrs.evolve(mount, writable="yes")


def test_text_forms_accept_ro_and_rw(tmp_path: Path) -> None:
    """The CLI and dict forms take an optional :ro or :rw suffix on the host path."""
    assert Mount.parse(f"/data={tmp_path}:rw").writable
    assert not Mount.parse(f"/data={tmp_path}:ro").writable
    assert not Mount.from_text("/data", str(tmp_path)).writable
    with pytest.raises(UsageError, match="not of the form"):
        Mount.parse("/data")
