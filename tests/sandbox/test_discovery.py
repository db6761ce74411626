"""Finding backends by name, by entry point, and the best one for this host."""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import (
    BackendReport,
    Bubblewrap,
    Nsjail,
    Policy,
    Promise,
    Sandbox,
    _discovery,
)
from astralvessel.sandbox._discovery import (
    AUTOMATIC_ORDER,
    all_backends,
    backend_names,
    best_available,
    get_backend,
)


def test_builtins_by_name():
    """The built-in names give the built-in classes."""
    assert isinstance(get_backend("bubblewrap"), Bubblewrap)
    assert isinstance(get_backend("nsjail"), Nsjail)
    assert get_backend("unconfined").confined is False


def test_unknown_name_says_how_to_install():
    """An unknown backend name raises with the known names and how to install a third-party one."""
    with pytest.raises(BackendUnavailableError, match=r"astralvessel\.backends") as info:
        get_backend("firecracker")
    assert "bubblewrap" in str(info.value)


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A third-party backend module, registered as an entry point the way a package would."""
    (tmp_path / "vessel_fake_backend.py").write_text(
        textwrap.dedent(
            """
            from astralvessel.sandbox import BackendReport, Sandbox
            class Fake(Sandbox):
                name = "fake"
                def probe(self):
                    return BackendReport(name="fake", available=False, reason="fake")
                def open(self, policy):
                    raise RuntimeError("fake")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(
        name="fake", value="vessel_fake_backend:Fake", group=_discovery.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(_discovery, "_entry_points", lambda: {"fake": point})
    yield "fake"
    sys.modules.pop("vessel_fake_backend", None)


def test_third_party_loaded_only_when_asked(third_party):
    """A third-party backend's module is imported only when its name is asked for."""
    assert "vessel_fake_backend" not in sys.modules
    assert third_party in backend_names()
    assert "vessel_fake_backend" not in sys.modules
    backend = get_backend(third_party)
    assert isinstance(backend, Sandbox)
    assert backend.name == "fake"


def test_all_backends_lists_every_name(third_party):
    """all_backends gives one instance per known name; one that cannot load still reports."""
    names = [
        backend.probe().name if backend.name != "fake" else "fake" for backend in all_backends()
    ]
    assert {"bubblewrap", "nsjail", "docker", "unconfined", "fake"} <= set(names)


def test_unloadable_backend_reports_and_refuses(monkeypatch):
    """A backend whose module cannot load is listed, says why in probe, and refuses to start."""
    broken = EntryPoint(
        name="broken", value="vessel_no_such_module:Nothing", group=_discovery.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(_discovery, "_entry_points", lambda: {"broken": broken})
    (backend,) = [b for b in all_backends() if b.name == "broken"]
    report = backend.probe()
    assert not report.available
    assert "vessel_no_such_module" in report.reason
    with pytest.raises(BackendUnavailableError, match="vessel_no_such_module"):
        backend.start(Policy())


def test_best_available_prefers_bubblewrap_here():
    """On this host the best confined backend is bubblewrap."""
    assert isinstance(best_available(), Bubblewrap)


def test_best_available_never_unconfined():
    """When no confined backend can run, best_available raises with each one's reason, never unconfined."""

    def nothing_works(backend: Sandbox) -> BackendReport:
        return BackendReport(
            name=backend.name, available=False, reason=f"{backend.name} is broken here"
        )

    with pytest.raises(BackendUnavailableError) as info:
        best_available(probe=nothing_works)
    for name in AUTOMATIC_ORDER:
        assert f"{name} is broken here" in str(info.value)
    assert "unconfined" in str(info.value)


def test_best_available_skips_a_backend_with_a_broken_promise():
    """A backend that runs but cannot keep a promise is passed over for the next one."""

    def bwrap_leaks(backend: Sandbox) -> BackendReport:
        if backend.name == "bubblewrap":
            return BackendReport(
                name="bubblewrap", available=True, unenforced={Promise.DISK_LIMIT: "old bwrap"}
            )
        return BackendReport(name=backend.name, available=True)

    assert isinstance(best_available(probe=bwrap_leaks), Nsjail)
