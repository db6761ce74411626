"""Turns started alike share one confinement probe: the host hands the first one's answer on."""

from __future__ import annotations

import pytest

from astralvessel.errors import PromiseNotEnforcedError
from astralvessel.sandbox import Limits, Policy, _session
from astralvessel.sandbox._discovery import get_backend

BACKENDS = ["bubblewrap", "nsjail"]


@pytest.mark.parametrize("name", BACKENDS)
def test_a_turn_started_alike_takes_the_earlier_probe(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server of a second turn started alike reports what the host handed it, not a new probe."""
    monkeypatch.setattr(_session, "_PROBED", {})
    backend = get_backend(name)
    backend.start(Policy()).close()
    (key,) = _session._PROBED
    assert _session._PROBED[key] == {}
    # A made-up failure planted as the earlier answer: only a server that took it says it.
    _session._PROBED[key] = {"seccomp": "planted by the test"}
    with pytest.raises(PromiseNotEnforcedError, match="planted by the test"):
        backend.start(Policy())
    # Other limits are another confinement: that turn probes for itself and starts.
    other = backend.start(Policy(limits=Limits(processes=17)))
    try:
        assert other.unenforced() == {}
    finally:
        other.close()
    assert len(_session._PROBED) == 2
