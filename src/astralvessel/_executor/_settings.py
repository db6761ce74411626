"""The host's settings for an executor: one frozen value, each field checked as it is set.

``Executor`` and ``RayExecutor`` build an ``ExecutorSettings`` from their keyword
arguments, so a wrong value raises the same ``UsageError`` naming the argument,
on the host, before any sandbox starts or any Ray call is made. The checks are the
fields' converters and validators, so they run on every way of building one
(``ExecutorSettings(...)``, ``attrs.evolve``). Without them a wrong type failed far
from its cause: ``timeout_seconds="5"`` as a ``TypeError`` inside the session,
``mounts="/data=..."`` as one mount per character, ``output_chars="5"`` as a
sandbox that "died".

What the host left out (``None``) takes the agent's value, else the defaults of
``agent.py`` and ``Limits``: the ``*_for`` methods resolve them, in one place for
both executors.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

import attrs

from .._ground._ledger import Ledger
from .._ground._netallow import HostPattern, parse_allow_list
from .._ground._seconds import check_seconds
from .._ground._suggest import unknown_name
from ..agent import TOOL_OUTPUT_CHARS, TOOL_TIMEOUT_SECONDS, Agent
from ..errors import UsageError
from ..sandbox._policy import (
    EVAL_RELAXATIONS,
    WORKSPACE_DIR,
    Limits,
    Mount,
    Policy,
    Promise,
    Relaxations,
    check_mount_target,
    promise_set,
)
from ..sandbox._uids import UidRange
from ..spec import ALL_SCOPES, Scope
from ._warm import check_warm

if TYPE_CHECKING:
    from ..registry import Registry
    from ..web import AsyncTransport, Fetcher, Searcher, SearchProvider, Transport
    from ._snapshot._value import TurnSnapshot

__all__ = [
    "SNAPSHOT_BUDGET_MB",
    "ExecutorSettings",
    "MountsArg",
    "check_mount_items",
    "check_registry",
    "check_snapshot",
    "settings_from",
]

#: ``Executor(mounts=)``: ``{sandbox path: host path[:rw]}`` or a list of ``Mount``.
MountsArg = Mapping[str, "str | Path"] | Iterable[Mount]
#: The bytes of live snapshots an executor's turns may hold, by default (MiB).
SNAPSHOT_BUDGET_MB = 4096


def check_registry(registry: object, who: str = "Executor") -> Registry:
    """``registry`` itself, or ``UsageError`` when it is not a ``Registry``."""
    from ..registry import Registry

    if not isinstance(registry, Registry):
        raise UsageError(
            f"{who} takes a Registry, such as Registry.for_agent(Agent.load(folder)), "
            f"not {_kind(registry)}"
        )
    return registry


def check_snapshot(snapshot: object) -> TurnSnapshot | None:
    """A turn's ``snapshot``, or None; ``UsageError`` for anything but a ``TurnSnapshot``."""
    from ._snapshot._value import TurnSnapshot

    if snapshot is None or isinstance(snapshot, TurnSnapshot):
        return snapshot
    raise UsageError(
        "snapshot is a TurnSnapshot (from Turn.snapshot() or TurnSnapshot.load), "
        f"not {_kind(snapshot)}"
    )


def _texts(name: str, values: object) -> list[Any]:
    """The items of ``values``, a list of names; a bare text would be one name per character."""
    if isinstance(values, (str, bytes)):
        raise UsageError(f"{name} is a list of names, not the text {values!r}")
    if not isinstance(values, Iterable) or isinstance(values, Mapping):
        raise UsageError(f"{name} is a list of names, not {_kind(values)}")
    return list(values)


def _scopes(scopes: object) -> frozenset[Scope] | None:
    if scopes is None:
        return None
    return frozenset(
        s if isinstance(s, Scope) else Scope.parse(s if isinstance(s, str) else repr(s))
        for s in _texts("scopes", scopes)
    )


def _relax(promises: object) -> frozenset[Promise]:
    return promise_set(_texts("relax", promises))


def check_mount_items(mounts: object) -> dict[str, str]:
    """A ``{sandbox path: host path}`` mapping as text, checked without touching the disk.

    What ``RayExecutor`` checks on the host: each node resolves the host paths itself.
    """
    if not isinstance(mounts, Mapping):
        raise UsageError(
            "mounts is a mapping such as {'/data': 'host/folder'} or a list of Mount, "
            f"not {_kind(mounts)}"
        )
    items: dict[str, str] = {}
    for target, source in mounts.items():
        if not isinstance(target, (str, PurePosixPath)):
            raise UsageError(f"a mount's sandbox path is text such as '/data', not {_kind(target)}")
        text = os.fspath(source) if isinstance(source, os.PathLike) else source
        if not isinstance(text, str):
            raise UsageError(
                f"the host path for {str(target)!r} is text or a Path (with ':rw' to make it "
                f"writable), not {_kind(text)}"
            )
        check_mount_target(PurePosixPath(target))
        items[str(target)] = text
    return items


def _mounts(mounts: object) -> tuple[Mount, ...]:
    """The mounts of a mapping or a list of ``Mount``; each host path must exist here."""
    if mounts is None:
        return ()
    if isinstance(mounts, Mapping):
        return tuple(Mount.from_text(t, s) for t, s in check_mount_items(mounts).items())
    if isinstance(mounts, (str, bytes)) or not isinstance(mounts, Iterable):
        check_mount_items(mounts)  # raises, naming what mounts takes
    listed = tuple(cast("Iterable[object]", mounts))
    for mount in listed:
        if not isinstance(mount, Mount):
            raise UsageError(
                "mounts as a list holds Mount values (Mount.parse('/data=host/folder')), "
                f"not {_kind(mount)}"
            )
    return cast("tuple[Mount, ...]", listed)


def _timeout(timeout: object) -> float | None:
    return None if timeout is None else check_seconds("timeout_seconds", timeout)


def _outbox_dir(chosen: object) -> Path | None:
    if chosen is None:
        return None
    if isinstance(chosen, (str, os.PathLike)):
        path = os.fspath(chosen)
        if isinstance(path, str) and path:
            return Path(path)
    raise UsageError(f"outbox_dir is a host folder (text or a Path), not {chosen!r}")


def _network_allow(patterns: object) -> tuple[HostPattern, ...] | None:
    return None if patterns is None else parse_allow_list(cast("Iterable[str]", patterns))


def _network_hosts(hosts: object) -> dict[str, tuple[str, ...]]:
    """Canonical host names to IP addresses (whether the allow-list lists them: ``hosts_for``)."""
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
        canonical = name.strip().lower().rstrip(".")
        checked[canonical] = tuple(str(ipaddress.ip_address(a)) for a in addresses)
    return checked


def _uid_range(value: object) -> UidRange | None:
    return None if value is None else UidRange.coerce(cast("UidRange | str", value))


def _ledger(value: object) -> Ledger | None:
    return Ledger.of(value)


def _one_of(name: str, what: str, *kinds: type) -> Callable[[object, object, Any], None]:
    """A validator: the value is None or one of ``kinds``; ``what`` says what ``name`` takes."""

    def check(instance: object, attribute: object, value: Any) -> None:
        if value is not None and not isinstance(value, kinds):
            raise UsageError(f"{name} is {what}, not {_kind(value)}")

    return check


def _opted(instance: object, attribute: attrs.Attribute[bool | None], value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise UsageError(
            f"{attribute.name} is True, False or None (the agent's setting), not {value!r}"
        )


def _whole(least: int, unit: str) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"{attribute.name} is a whole number of {unit}, not {value!r}")

    return check


def _fetcher(instance: object, attribute: object, fetcher: Any) -> None:
    from ..web import Fetcher

    _one_of("fetcher", "a web.Fetcher", Fetcher)(instance, attribute, fetcher)


def _searcher(instance: object, attribute: object, searcher: Any) -> None:
    """A ``Searcher``, or a provider with a ``name`` and ``search`` (sync-only ones serve
    sync calls), or None."""
    from ..web import Searcher

    if searcher is None or isinstance(searcher, Searcher):
        return
    if isinstance(getattr(searcher, "name", None), str) and callable(
        getattr(searcher, "search", None)
    ):
        return
    raise UsageError(
        "searcher is a web.Searcher or a SearchProvider (a name, search and asearch), "
        f"not {_kind(searcher)}"
    )


def _services(services: object) -> dict[str, Callable[..., Any]]:
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


def _warm(instance: object, attribute: object, size: object) -> None:
    check_warm(size)


def _snapshot(instance: object, attribute: object, snapshot: Any) -> None:
    check_snapshot(snapshot)


@attrs.frozen(kw_only=True)
class ExecutorSettings:
    """``Executor``'s keyword arguments but ``sandbox``, each checked; see ``Executor``.

    ``None`` leaves a setting to the agent (``*_for``); every field is named as
    the argument it comes from, so ``Executor(registry, **fields)`` rebuilds it.
    """

    mounts: tuple[Mount, ...] = attrs.field(default=(), converter=_mounts)
    scopes: frozenset[Scope] | None = attrs.field(default=None, converter=_scopes)
    limits: Limits | None = attrs.field(
        default=None,
        validator=_one_of("limits", "a Limits, such as Limits(disk_mb=256, processes=64)", Limits),
    )
    relax: frozenset[Promise] = attrs.field(default=frozenset(), converter=_relax)
    writable_root: bool | None = attrs.field(default=None, validator=_opted)
    root_identity: bool | None = attrs.field(default=None, validator=_opted)
    tool_servers: bool | None = attrs.field(default=None, validator=_opted)
    timeout_seconds: float | None = attrs.field(default=None, converter=_timeout)
    output_chars: int | None = attrs.field(default=None, validator=_whole(1, "characters above 0"))
    fetcher: Fetcher | None = attrs.field(default=None, validator=_fetcher)
    searcher: Searcher | SearchProvider | None = attrs.field(default=None, validator=_searcher)
    services: dict[str, Callable[..., Any]] = attrs.field(factory=dict, converter=_services)
    service_transport: Transport | AsyncTransport | None = None
    warm: int = attrs.field(default=0, validator=_warm)
    outbox_dir: Path | None = attrs.field(default=None, converter=_outbox_dir)
    network_allow: tuple[HostPattern, ...] | None = attrs.field(
        default=None, converter=_network_allow
    )
    network_hosts: dict[str, tuple[str, ...]] = attrs.field(factory=dict, converter=_network_hosts)
    uid_range: UidRange | None = attrs.field(default=None, converter=_uid_range)
    snapshot_budget_mb: int = attrs.field(
        default=SNAPSHOT_BUDGET_MB, validator=_whole(1, "MiB above 0")
    )
    snapshot: TurnSnapshot | None = attrs.field(default=None, validator=_snapshot)
    ledger: Ledger | None = attrs.field(default=None, converter=_ledger)

    def arguments(self) -> dict[str, Any]:
        """The fields as ``Executor``'s keyword arguments (each already in its checked form)."""
        return {field.name: getattr(self, field.name) for field in attrs.fields(type(self))}

    def scopes_for(self, agent: Agent | None) -> frozenset[Scope]:
        """The granted scopes: the host's, else the agent's, else all four."""
        if self.scopes is not None:
            return self.scopes
        return agent.scopes if agent is not None and agent.scopes is not None else ALL_SCOPES

    def timeout_for(self, agent: Agent | None) -> float:
        """A call's time limit when its tool names none: the host's, else the agent's."""
        if self.timeout_seconds is not None:
            return self.timeout_seconds
        return agent.tool_timeout_seconds if agent is not None else TOOL_TIMEOUT_SECONDS

    def output_chars_for(self, agent: Agent | None) -> int:
        """The characters of a call's output the model reads: the host's, else the agent's."""
        if self.output_chars is not None:
            return self.output_chars
        return agent.tool_output_chars if agent is not None else TOOL_OUTPUT_CHARS

    def policy_for(self, agent: Agent | None) -> Policy:
        """The turns' sandbox policy: the host's choices over the agent's ``vessel.toml``."""
        return Policy(
            agent_dir=agent.path if agent is not None else None,
            dockerfile=agent.dockerfile if agent is not None else None,
            workdir=agent.workdir if agent is not None else WORKSPACE_DIR,
            mounts=self.mounts,
            limits=self.limits or (agent.limits if agent is not None else Limits()),
            outbox_dir=self.outbox_dir,
            network_allow=self.network_allow_for(agent),
            **attrs.asdict(self.relaxations_for(agent), recurse=False),
            uid_range=self.uid_range,
            relaxed=self.relax,
        )

    def relaxations_for(self, agent: Agent | None) -> Relaxations:
        """The eval relaxations: each the host's choice, else the agent's ``[sandbox]`` key."""
        chosen = {name: getattr(self, name) for name in EVAL_RELAXATIONS}
        return attrs.evolve(
            agent.relaxations if agent is not None else Relaxations(),
            **{name: asked for name, asked in chosen.items() if asked is not None},
        )

    def network_allow_for(self, agent: Agent | None) -> tuple[HostPattern, ...]:
        """The hosts calls may reach: the host's list, else the agent's ``[network] allow``."""
        if self.network_allow is not None:
            return self.network_allow
        return agent.network_allow if agent is not None else ()

    def hosts_for(self, allow: Sequence[HostPattern]) -> dict[str, tuple[str, ...]]:
        """``network_hosts``; ``UsageError`` for a name the allow-list does not admit.

        Pinning a name no call may reach would silently do nothing, and the operator
        meant the turn to reach it.
        """
        for name in self.network_hosts:
            if not any(pattern.matches_name(name) for pattern in allow):
                raise UsageError(
                    f"network_hosts: {name!r} is not on the network allow-list "
                    f"({', '.join(map(str, allow)) or 'empty'}); list it, with its port, in "
                    "network_allow so calls may reach it"
                )
        return self.network_hosts


def settings_from(options: Mapping[str, Any], who: str) -> ExecutorSettings:
    """``ExecutorSettings`` from keyword arguments; ``UsageError`` for a name it has not."""
    names = [field.name for field in attrs.fields(ExecutorSettings)]
    for name in options:
        if name not in names:
            raise UsageError(unknown_name(f"{who} argument", name, names))
    return ExecutorSettings(**options)


def _kind(value: object) -> str:
    """How an error names a wrong value: its type, and the value when it is short."""
    shown = repr(value)
    name = type(value).__name__
    return f"{name} {shown}" if len(shown) <= 60 else name
