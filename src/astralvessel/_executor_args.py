"""The checks of ``Executor``'s own arguments: a host's wrong value raises ``UsageError`` at once.

Without them a wrong type was taken as it came and failed far from its cause:
``timeout_seconds="5"`` as a ``TypeError`` inside the session, ``limits={...}``
inside attrs, ``mounts="/data=..."`` as one mount per character, and
``output_chars="5"`` as a sandbox that "died". The checks name the argument and
say what it takes, as ``_exec`` does for ``Turn.exec``.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from ._netallow import HostPattern
from ._seconds import check_seconds
from .errors import UsageError
from .sandbox._policy import Limits, Mount
from .spec import Scope

if TYPE_CHECKING:
    from ._snapshot._value import TurnSnapshot
    from .registry import Registry
    from .web import Fetcher, Searcher, SearchProvider

__all__ = [
    "check_fetcher",
    "check_limits",
    "check_mounts",
    "check_network_hosts",
    "check_outbox_dir",
    "check_output_chars",
    "check_registry",
    "check_scopes",
    "check_searcher",
    "check_services",
    "check_snapshot",
    "check_snapshot_budget",
    "check_texts",
    "check_timeout",
]

MountsArg = Mapping[str, "str | Path"] | Iterable[Mount]


def check_registry(registry: object) -> Registry:
    """``registry`` itself, or ``UsageError`` when it is not a ``Registry``."""
    from .registry import Registry

    if not isinstance(registry, Registry):
        raise UsageError(
            "Executor takes a Registry, such as Registry.for_agent(Agent.load(folder)), "
            f"not {_kind(registry)}"
        )
    return registry


def check_texts(name: str, values: object) -> list[Any]:
    """The items of ``values``, a list of names; ``UsageError`` for one bare text or a non-list.

    A bare string is refused because iterating it gives one name per character.
    """
    if isinstance(values, (str, bytes)):
        raise UsageError(f"{name} is a list of names, not the text {values!r}")
    if not isinstance(values, Iterable) or isinstance(values, Mapping):
        raise UsageError(f"{name} is a list of names, not {_kind(values)}")
    return list(values)


def check_scopes(scopes: object) -> frozenset[Scope]:
    """The scopes named in ``scopes``; ``UsageError`` for a bare text or an unknown scope."""
    return frozenset(
        s if isinstance(s, Scope) else Scope.parse(s if isinstance(s, str) else repr(s))
        for s in check_texts("scopes", scopes)
    )


def check_mounts(mounts: object) -> tuple[Mount, ...]:
    """The mounts of a ``{sandbox path: host path}`` mapping or a list of ``Mount``.

    Raises ``UsageError`` for any other value, and for each mount as ``Mount`` does.
    """
    if mounts is None:
        return ()
    if isinstance(mounts, Mapping):
        return tuple(_mount_from_item(target, source) for target, source in mounts.items())
    if isinstance(mounts, (str, bytes)) or not isinstance(mounts, Iterable):
        raise UsageError(
            "mounts is a mapping such as {'/data': 'host/folder'} or a list of Mount, "
            f"not {_kind(mounts)}"
        )
    listed = tuple(mounts)
    for mount in listed:
        if not isinstance(mount, Mount):
            raise UsageError(
                "mounts as a list holds Mount values (Mount.parse('/data=host/folder')), "
                f"not {_kind(mount)}"
            )
    return listed


def _mount_from_item(target: object, source: object) -> Mount:
    if not isinstance(target, (str, PurePosixPath)):
        raise UsageError(f"a mount's sandbox path is text such as '/data', not {_kind(target)}")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise UsageError(
            f"the host path for {str(target)!r} is text or a Path (with ':rw' to make it "
            f"writable), not {_kind(source)}"
        )
    return Mount.from_text(target, source)


def check_limits(limits: object) -> Limits | None:
    """``limits`` itself when it is a ``Limits`` or None, else ``UsageError``."""
    if limits is None or isinstance(limits, Limits):
        return limits
    raise UsageError(
        f"limits is a Limits, such as Limits(disk_mb=256, processes=64), not {_kind(limits)}"
    )


def check_timeout(timeout: object) -> float | None:
    """``timeout_seconds`` as a float, or None; ``UsageError`` as ``check_seconds`` raises."""
    return None if timeout is None else check_seconds("timeout_seconds", timeout)


def check_output_chars(chars: object) -> int | None:
    """``output_chars``, or None; ``UsageError`` unless a whole number above 0."""
    if chars is None:
        return None
    if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
        raise UsageError(f"output_chars is a whole number of characters above 0, not {chars!r}")
    return chars


def check_snapshot_budget(megabytes: object) -> int:
    """``snapshot_budget_mb``; ``UsageError`` unless a whole number of MiB above 0."""
    if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 1:
        raise UsageError(f"snapshot_budget_mb is a whole number of MiB above 0, not {megabytes!r}")
    return megabytes


def check_snapshot(snapshot: object) -> TurnSnapshot | None:
    """A turn's ``snapshot``, or None; ``UsageError`` for anything but a ``TurnSnapshot``."""
    from ._snapshot._value import TurnSnapshot

    if snapshot is None or isinstance(snapshot, TurnSnapshot):
        return snapshot
    raise UsageError(
        "snapshot is a TurnSnapshot (from Turn.snapshot() or TurnSnapshot.load), "
        f"not {_kind(snapshot)}"
    )


def check_outbox_dir(chosen: object) -> Path | None:
    """``outbox_dir`` as a Path, or None; ``UsageError`` for anything but text or a path."""
    if chosen is None:
        return None
    if isinstance(chosen, (str, os.PathLike)):
        path = os.fspath(chosen)
        if isinstance(path, str) and path:
            return Path(path)
    raise UsageError(f"outbox_dir is a host folder (text or a Path), not {chosen!r}")


def check_services(services: object) -> dict[str, Callable[..., Any]]:
    """``services`` as a dict of names to callables; ``UsageError`` for any other value."""
    if services is None:
        return {}
    if not isinstance(services, Mapping):
        raise UsageError(
            f"services maps [services] names to Python callables, not {_kind(services)}"
        )
    for name, function in services.items():
        if not isinstance(name, str) or not callable(function):
            raise UsageError(
                f"services maps [services] names to Python callables; got {name!r}: "
                f"{_kind(function)}"
            )
    return dict(services)


def check_network_hosts(hosts: object, allow: Sequence[HostPattern]) -> dict[str, tuple[str, ...]]:
    """``network_hosts`` as canonical names to IP addresses; ``UsageError`` naming what is wrong.

    Each name must be one the allow-list admits: pinning a name no call may reach would
    silently do nothing, and the operator meant the turn to reach it.
    """
    if hosts is None:
        return {}
    if not isinstance(hosts, Mapping):
        raise UsageError(
            f"network_hosts maps host names to addresses, such as "
            f"{{'wiki.internal': '10.20.0.5'}}, not {_kind(hosts)}"
        )
    checked: dict[str, tuple[str, ...]] = {}
    for name, given in hosts.items():
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"network_hosts: {name!r} is not a host name")
        canonical = name.strip().lower().rstrip(".")
        if not any(pattern.matches_name(canonical) for pattern in allow):
            raise UsageError(
                f"network_hosts: {name!r} is not on the network allow-list "
                f"({', '.join(map(str, allow)) or 'empty'}); list it, with its port, in "
                "network_allow so calls may reach it"
            )
        addresses = (given,) if isinstance(given, str) else given
        if not isinstance(addresses, Sequence) or not addresses:
            raise UsageError(f"network_hosts: {name!r} maps to {given!r}, not an IP address")
        for address in addresses:
            try:
                ipaddress.ip_address(address)
            except (TypeError, ValueError):
                raise UsageError(
                    f"network_hosts: {name!r} maps to {address!r}, which is not an IP address"
                ) from None
        checked[canonical] = tuple(str(ipaddress.ip_address(a)) for a in addresses)
    return checked


def check_fetcher(fetcher: object) -> Fetcher | None:
    """``fetcher`` itself when it is a ``Fetcher`` or None, else ``UsageError``."""
    from .web import Fetcher

    if fetcher is None or isinstance(fetcher, Fetcher):
        return fetcher
    raise UsageError(f"fetcher is a web.Fetcher, not {_kind(fetcher)}")


def check_searcher(searcher: object) -> Searcher | SearchProvider | None:
    """``searcher`` itself when it is a ``Searcher``, a ``SearchProvider`` or None.

    A provider needs only its ``name`` and ``search`` here: one without ``asearch``
    still serves sync calls, as it did before this check.
    """
    from .web import Searcher

    if searcher is None or isinstance(searcher, Searcher):
        return searcher
    if isinstance(getattr(searcher, "name", None), str) and callable(
        getattr(searcher, "search", None)
    ):
        return cast("SearchProvider", searcher)
    raise UsageError(
        "searcher is a web.Searcher or a SearchProvider (a name, search and asearch), "
        f"not {_kind(searcher)}"
    )


def _kind(value: object) -> str:
    """How an error names a wrong value: its type, and the value when it is short."""
    shown = repr(value)
    name = type(value).__name__
    return f"{name} {shown}" if len(shown) <= 60 else name
