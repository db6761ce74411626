"""Ray under a long TMPDIR: Ray's own sockets go there; astralvessel says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel import BackendUnavailableError, Registry
from astralvessel.ray import RayExecutor


def test_a_local_ray_refused_a_long_tmpdir_says_how_to_start_it(
    ray_module: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RayExecutor that starts a local Ray under a TMPDIR too long for Ray's sockets raises
    BackendUnavailableError naming RAY_TMPDIR, not Ray's bare OSError (Ray starts nothing)."""
    if ray_module.is_initialized():  # type: ignore[attr-defined]
        pytest.fail("this process joined a Ray cluster already: this test must start its own")
    long_tmp = tmp_path / ("t" * 60) / ("m" * 60)
    long_tmp.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # Else a new local Ray turns token auth on: it writes ~/.ray/auth_token, which every later
    # `ray start` then requires (the cluster fixture's `ray status` fails), and sets
    # RAY_AUTH_MODE in this process's environment.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    token = Path.home() / ".ray" / "auth_token"
    had_token = token.exists()
    with pytest.raises(BackendUnavailableError, match="RAY_TMPDIR=/tmp/ray"):
        RayExecutor(Registry(), sandbox="bubblewrap")
    assert not ray_module.is_initialized()  # type: ignore[attr-defined]
    assert token.exists() == had_token
