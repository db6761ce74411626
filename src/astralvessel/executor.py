"""Executor and Turn: run a model's tool calls, one sandbox per turn.

The executor owns policy (which tools, which scopes, which mounts and limits),
built from its checked settings (``_settings``); a turn owns one running sandbox
and its workspace. ``Turn`` is ``_turn.BaseTurn`` (typed against what a turn uses
of its executor) opened by an ``Executor``, so ``_turn`` never names this module.
Every model mistake becomes a ``ToolResult`` with ``is_error``; only the host's
mistakes raise.
"""

from __future__ import annotations

import collections
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ._calls._plans import TurnContext
from ._executor._adopt import adopt_warm, adoptable, warm_policy
from ._executor._closing import Closing, refuse_if_ended
from ._executor._network import WarmNetwork, admit_hosts, start_proxy, start_sandbox
from ._executor._settings import (
    SNAPSHOT_BUDGET_MB,
    ExecutorSettings,
    MountsArg,
    check_registry,
    check_snapshot,
)
from ._executor._snapshot._capture import restore
from ._executor._snapshot._mechanism import (
    adopts_warm,
    held_stacked_lower,
    lower_by_descriptor,
    overlay_backend,
    stacked_lower,
)
from ._executor._snapshot._store import MIB, Budget
from ._executor._snapshot._value import TurnSnapshot
from ._executor._turn import BaseTurn
from ._executor._warm import AHEAD_WAIT, WarmPool
from ._ground._ledger import Ledger
from .errors import SnapshotError
from .sandbox._base import Sandbox, SandboxSession
from .sandbox._policy import Limits, Policy, Promise
from .sandbox._uids import UidRange
from .spec import Scope

if TYPE_CHECKING:
    from .registry import Registry
    from .web import AsyncTransport, Fetcher, Searcher, SearchProvider, Transport
    from .web._proxy import EgressProxy

__all__ = ["Executor", "Turn"]


class Executor(Closing):
    """Binds a registry to a sandbox backend, mounts, granted scopes and limits.

    ``sandbox`` is a backend instance, a backend name (``"bubblewrap"``...), or
    None for the best confined backend that can run here. ``mounts`` maps sandbox
    paths to host folders, read-only unless the host path ends in ``:rw`` (``:ro``
    says read-only explicitly), or lists ``Mount`` values. ``scopes``
    defaults to the agent's ``scopes``, or all four when it names none.
    ``relax`` names confinement promises the host explicitly gives up.
    ``writable_root``, ``root_identity`` and ``tool_servers`` opt into the eval
    relaxations of ``Policy`` (a writable per-turn root, uid 0 without
    capabilities, unix sockets, sessions and private terminals); None
    takes the agent's ``[sandbox]`` setting, False without an agent.
    ``fetcher`` serves webfetch (a default ``Fetcher`` when None); ``searcher``
    (a ``Searcher`` or a bare ``SearchProvider``) serves websearch. ``services``
    binds Python callables to ``[services]`` names, and ``service_transport``
    carries service tools' HTTP posts (the stdlib transport when None).
    ``warm`` keeps that many sandboxes started ahead for this executor's
    policy, so a turn takes a ready one instead of starting its own; each
    still serves exactly one turn. ``close()`` (or leaving ``with Executor(...)``)
    kills the ones still waiting; turns opened after it start cold.
    ``outbox_dir`` is the host folder where the files calls leave in
    ``$VESSEL_OUTBOX`` are written (one folder per turn, one per call inside it)
    and kept, for as long as the host wants them; without it each turn's go to a
    temporary folder, removed once the turn is closed and no result (no
    ``OutboxFile``) naming its files is left.
    ``network_allow`` lists the hosts calls may reach through the host's
    egress proxy (``pypi.org``, ``pypi.org:8080``, ``*.example.org``); it
    replaces the agent's ``[network] allow``, as ``scopes`` and ``limits``
    replace theirs, and ``[]`` turns the network off. Without either list
    calls have no network at all.
    ``network_hosts`` pins listed names to addresses on the host or the local
    network (``{"wiki.internal": "10.20.0.5"}``): the name resolves to exactly
    those addresses, which are admitted on the ports the allow-list gives the
    name and on no other; a name the allow-list does not list is a ``UsageError``.
    ``uid_range`` (a ``UidRange`` or ``"FIRST-LAST"``) is where a root host's
    turns lease their own host uid from, one live turn per uid across every
    process on the host; without it, ``$ASTRALVESSEL_UID_RANGE``, else
    2013265920-2013331455 (see the threat model, "Identity and budget").
    ``snapshot`` (a ``TurnSnapshot``) is the files every turn starts with,
    warm ones included, unless ``turn(snapshot=...)`` names another.
    ``snapshot_budget_mb`` bounds the distinct bytes of the snapshots this
    executor's turns take that are still alive (4096 MiB; a file several
    snapshots share counts once); one past it raises ``SnapshotError``.
    ``ledger`` (a folder, a file, a callable, or a ``Ledger`` with a redaction
    hook) receives one JSON-lines record per event of each turn (see
    ``docs/observing.md``).
    A value of the wrong type or out of range for any argument (a bare string
    for a list, ``limits`` as a dict, ``timeout_seconds`` of 0, NaN or text)
    raises ``UsageError`` naming the argument, before any sandbox starts.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        sandbox: Sandbox | str | None = None,
        mounts: MountsArg | None = None,
        scopes: Iterable[Scope | str] | None = None,
        limits: Limits | None = None,
        relax: Iterable[Promise | str] = (),
        writable_root: bool | None = None,
        root_identity: bool | None = None,
        tool_servers: bool | None = None,
        timeout_seconds: float | None = None,
        output_chars: int | None = None,
        fetcher: Fetcher | None = None,
        searcher: Searcher | SearchProvider | None = None,
        services: Mapping[str, Callable[..., Any]] | None = None,
        service_transport: Transport | AsyncTransport | None = None,
        warm: int = 0,
        outbox_dir: str | os.PathLike[str] | None = None,
        network_allow: Iterable[str] | None = None,
        network_hosts: Mapping[str, str | Sequence[str]] | None = None,
        uid_range: UidRange | str | None = None,
        snapshot_budget_mb: int = SNAPSHOT_BUDGET_MB,
        snapshot: TurnSnapshot | None = None,
        ledger: Ledger | str | os.PathLike[str] | Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        registry = check_registry(registry)
        settings = ExecutorSettings(
            mounts=mounts,
            scopes=scopes,
            limits=limits,
            relax=relax,
            writable_root=writable_root,
            root_identity=root_identity,
            tool_servers=tool_servers,
            timeout_seconds=timeout_seconds,
            output_chars=output_chars,
            fetcher=fetcher,
            searcher=searcher,
            services=services,
            service_transport=service_transport,
            warm=warm,
            outbox_dir=outbox_dir,
            network_allow=network_allow,
            network_hosts=network_hosts,
            uid_range=uid_range,
            snapshot_budget_mb=snapshot_budget_mb,
            snapshot=snapshot,
            ledger=ledger,
        )
        agent = registry.agent
        self.registry = registry
        self.sandbox = _resolve_backend(sandbox)
        #: The host's settings as given and checked (what the agent fills in is resolved below).
        self.settings = settings
        self.scopes: frozenset[Scope] = settings.scopes_for(agent)
        self.timeout_seconds = settings.timeout_for(agent)
        self.output_chars = settings.output_chars_for(agent)
        self.policy = settings.policy_for(agent)
        # The operator's pinned names reach the proxy (and webfetch) through the one fetcher.
        self.fetcher: Fetcher = admit_hosts(
            _fetcher(settings.fetcher),
            settings.hosts_for(self.policy.network_allow),
            self.policy.network_allow,
        )
        self.searcher: Searcher | None = _searcher(settings.searcher)
        self.services: dict[str, Callable[..., Any]] = settings.services
        #: The web Transport service tools post through (the stdlib one when None).
        self.service_transport: Transport | AsyncTransport | None = service_transport
        #: The distinct bytes of the snapshots its turns took that are still alive (its budget).
        self.snapshot_budget = Budget(settings.snapshot_budget_mb * MIB)
        #: The files every turn opened without a snapshot of its own starts with (warm ones too).
        self.snapshot: TurnSnapshot | None = settings.snapshot
        #: Where each turn's records go (None: no ledger).
        self.ledger: Ledger | None = settings.ledger
        self._warm: WarmPool | None = None
        self._release: Callable[[], None] = _nothing
        #: Starts warm sandboxes with their turns' egress proxies (a network and warm= only).
        self._network: WarmNetwork | None = None
        if settings.warm:
            self._warm = self._warm_pool(settings.warm)
        if self._warm is not None:
            # Warm sandboxes of an executor nobody closed die when it is collected.
            self._release = weakref.finalize(self, self._warm.close)
        #: Forks' sandboxes started ahead (``Turn.fork``), a warm pool per snapshot, the
        #: newest few: each starts one sandbox per fork at most, ``FORKS_AHEAD`` at a time.
        self._ahead: _AheadPools = collections.OrderedDict()
        self._release_ahead = weakref.finalize(self, _close_pools, self._ahead)

    def _start_ahead(self, snapshot: TurnSnapshot, forks: int, ready: int = 1) -> int:
        """Start the sandboxes of ``forks`` turns opened from ``snapshot`` in the background,
        ``FORKS_AHEAD`` at a time: a fork's first call then takes a started one, as a warm
        turn's does, or starts its own where none is ready yet (or a start failed).

        The pool keeps ``FORKS_AHEAD`` ready, or ``ready`` when ``fork`` waits for more:
        never more than one per fork in all. Not under a network (each sandbox's egress
        proxy is its turn's), nor once closed. Returns how many ``fork`` waits for:
        ``ready``, or (unless ``ready`` is 0) as many forks as there are warm sandboxes
        ready to adopt, whose adoptions take milliseconds, not a sandbox's start each.
        """
        if self.policy.network_allow or self._release_ahead.alive is False:
            return ready
        adopting = self._adopting_pool(snapshot)
        if ready and adopting is not None:
            ready = max(ready, min(forks, adopting.ready))
        pools = self._ahead
        for spent in [key for key, (_, pool) in pools.items() if pool.spent]:
            pools.pop(spent)[1].close()
        key = id(snapshot)
        if key in pools:  # forks of the same files (a fork of an unstarted fork) share it
            pools.move_to_end(key)
            pools[key][1].extend(forks, max(min(forks, FORKS_AHEAD), ready))
            return ready
        while len(pools) >= _AHEAD_POOLS:
            pools.popitem(last=False)[1][1].close()
        held = weakref.ref(snapshot)
        at_once = min(forks, FORKS_AHEAD)
        pool = self._warm_pool(
            max(at_once, ready), held, total=forks, fillers=at_once, first_alone=ready <= 1
        )
        pools[key] = (held, pool)
        # The pool holds the snapshot weakly: when no fork (nor anyone) holds it, its tree
        # goes and the pool's waiting sandboxes with it.
        weakref.finalize(snapshot, _drop_pool, pools, key, pool)
        return ready

    def _wait_ahead(
        self, snapshot: TurnSnapshot, ready: int = 1, abandon: threading.Event | None = None
    ) -> None:
        """Wait until ``ready`` of ``snapshot``'s forks' sandboxes started ahead are ready,
        so calls made as ``fork`` returns take them rather than starting their own cold.

        ``AHEAD_WAIT`` per start at most, and never an error: a start that failed or is
        slow leaves the fork's first call to adopt the start still in flight, or start its
        own. Closing the executor, or setting ``abandon`` (the forked turn closing), ends it.
        """
        ahead = self._ahead.get(id(snapshot))
        if ahead is not None and ahead[0]() is snapshot:
            ahead[1].wait_ready(ready, AHEAD_WAIT, abandon)

    def _warm_pool(
        self,
        size: int,
        ahead: weakref.ref[TurnSnapshot] | None = None,
        total: int | None = None,
        fillers: int = 1,
        first_alone: bool = True,
    ) -> WarmPool:
        """The pool of ``size`` sandboxes started ahead, each with the executor's snapshot
        (or ``ahead``'s, the forks', starting ``total`` at most, ``fillers`` at a time)."""
        snapshot = self.snapshot if ahead is None else ahead()
        policy = self._policy_for(snapshot)
        if ahead is None:
            policy = warm_policy(self.sandbox.name, policy, snapshot)
        start: Callable[[], SandboxSession] = lambda: self.sandbox.start(policy)  # noqa: E731
        discard: Callable[[SandboxSession], None] = lambda session: session.close()  # noqa: E731
        if self.policy.network_allow:
            network = self._network = WarmNetwork(self.sandbox, policy, self.fetcher)
            start, discard = network.start, network.discard
        if snapshot is None:
            return WarmPool(self.sandbox, self.policy, size, start=start, discard=discard)
        del snapshot  # the forks' pool must not keep theirs alive
        kept = self.snapshot

        def start_restored() -> SandboxSession:
            fitting = kept if ahead is None else ahead()
            if fitting is None:
                raise SnapshotError("the forks' snapshot is gone: no fork is left to start for")
            self._check_fits(fitting)  # raised where the pool's starts raise, as a copy's was
            if ahead is not None:
                # A fork's start ahead adopts a warm sandbox where one is ready: its layer
                # laid in a few milliseconds, not a sandbox started (``_executor._adopt``).
                adopted = adopt_warm(self._adopting_pool(fitting), fitting)
                if adopted is not None:
                    return adopted
            session = start()
            try:
                self._restore(session, fitting)
            except BaseException:
                discard(session)
                raise
            return session

        return WarmPool(
            self.sandbox,
            self.policy,
            size,
            start=start_restored,
            discard=discard,
            total=total,
            fillers=fillers,
            first_alone=first_alone,
        )

    def turn(self, snapshot: TurnSnapshot | None = None) -> Turn:
        """Open one turn: a context manager (``with`` or ``async with``) owning one sandbox.

        Its workspace starts as ``snapshot``'s files, or the executor's own
        ``snapshot``'s when it has one (copied in as its sandbox starts); its
        writes never change the snapshot.
        """
        chosen = check_snapshot(snapshot)
        return Turn(self, snapshot=self.snapshot if chosen is None else chosen)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until every warm sandbox is started; False if ``timeout`` passed first.

        Without ``warm`` there is nothing to wait for (True). Raises what
        starting a sandbox raised, when the pool could not start one.
        """
        pool = self._warm
        return pool is None or pool.wait_filled(timeout)

    def close(self) -> None:
        """Kill the warm sandboxes still waiting for a turn; turns opened after it start cold."""
        self._warm = None
        self._release()
        self._release_ahead()

    def _start_session(
        self,
        proxy: EgressProxy | None = None,
        snapshot: TurnSnapshot | None = None,
        closing: threading.Event | None = None,
    ) -> tuple[SandboxSession, EgressProxy | None]:
        """A running sandbox for one turn, and the turn's egress proxy when it has a network.

        A warm sandbox if one is ready (with the proxy it was started with, and
        the executor's snapshot, or a fork's started ahead, or being started
        ahead), else one started now, with ``snapshot``'s files. ``proxy`` is
        the turn's own when an earlier sandbox of the turn died: the turn keeps
        it, so its bounds stay the turn's. ``closing`` is set when the turn is
        being closed: a wait for a fork's start ahead then ends, with
        ``TurnClosedError`` rather than a cold start nobody will use.
        """
        ready = None if proxy is not None else self._take_ready(snapshot, closing)
        if ready is not None:
            return ready
        refuse_if_ended(closing is not None and closing.is_set())
        if snapshot is not None:
            self._check_fits(snapshot)
        policy = self._policy_for(snapshot)
        started = proxy
        if started is None:
            started = start_proxy(self.policy, self.fetcher)
        try:
            if started is None:
                session = self.sandbox.start(policy)
            else:
                session = start_sandbox(self.sandbox, policy, started)
        except BaseException:
            if started is not None and started is not proxy:
                started.close()
            raise
        if snapshot is not None:
            try:
                self._restore(session, snapshot)
            except BaseException:
                session.close()
                if started is not None and started is not proxy:
                    started.close()
                raise
        return session, started

    def _take_ready(
        self, snapshot: TurnSnapshot | None, closing: threading.Event | None = None
    ) -> tuple[SandboxSession, EgressProxy | None] | None:
        """A sandbox started ahead for a turn opened from ``snapshot``, if one is ready.

        A fork's pool is also waited on when its start in flight is not yet claimed
        (a call made as ``fork`` returns): that start is the fork's, and a second one
        beside it would only slow both. The executor's warm pool never waits.
        """
        ahead = self._ahead.get(id(snapshot)) if snapshot is not None else None
        session = None
        if ahead is not None and ahead[0]() is snapshot:
            session = ahead[1].take(adopt=True, abandon=closing)
        if session is None and snapshot is not None and snapshot is not self.snapshot:
            # None started ahead (or none coming): a warm sandbox of the executor's, adopted.
            self._check_fits(snapshot)  # as a cold start would, before any sandbox is taken
            session = adopt_warm(self._adopting_pool(snapshot), snapshot)
        if session is not None:
            return session, None  # neither starts ahead nor adopts under a network
        pool = self._warm
        if pool is not None and pool.policy == self.policy and snapshot == self.snapshot:
            session = pool.take()
            if session is not None:
                network = self._network
                return session, None if network is None else network.claim(session)
        return None

    def _adopting_pool(self, snapshot: TurnSnapshot) -> WarmPool | None:
        """The executor's warm pool where a turn opened from ``snapshot`` (a fork) may
        adopt its sandboxes (else None)."""
        pool = self._warm
        if pool is None or pool.policy != self.policy or self.snapshot is not None:
            return None
        # The warm sandboxes started adoptable (``warm_policy``), and the layer can be passed.
        if not adopts_warm(self.sandbox.name) or self.policy.network_allow:
            return None
        # Where the backend's channel cannot carry the layer (Docker's attach stream).
        here = getattr(self.sandbox, "adopts_warm_here", None)
        if here is not None and not here():
            return None
        return pool if adoptable(snapshot, self.sandbox.name) else None

    def _policy_for(self, snapshot: TurnSnapshot | None) -> Policy:
        """The policy a sandbox opened from ``snapshot`` starts with: the snapshot's tree
        as its workspace's lower layer, where the backend opens snapshots copy-on-write."""
        if snapshot is None or not overlay_backend(self.sandbox.name):
            return self.policy
        if len(snapshot.held_stack) > 1:
            return self._held_stack_policy(snapshot)
        held = snapshot.held_layer
        if held is not None:
            # A frozen layer an ordinary user's host holds: passed to the server by
            # descriptor where the launcher can (else the files are copied in).
            if not lower_by_descriptor(self.sandbox.name):
                return self.policy
            return attrs.evolve(self.policy, workspace_lower_fd=held)
        layers = snapshot.stack
        if len(layers) > 1 and stacked_lower(self.sandbox.name):
            # A fork's layer over its parent's: the server lays its overlay on them all
            # (each idmapped to the calls' uid), never on their merged overlay (no overlay
            # can be idmapped, nor lie on one so deep).
            return attrs.evolve(self.policy, workspace_layers=tuple(t.path for t in layers))
        return attrs.evolve(self.policy, workspace_lower=snapshot.path)

    def _held_stack_policy(self, snapshot: TurnSnapshot) -> Policy:
        """An ordinary user's stack of held layers: each passed by descriptor, top first,
        the server laying its overlay on its clones of them all (else the files are
        copied in: a backend that lays no overlay on several layers)."""
        if not held_stacked_lower(self.sandbox.name):
            return self.policy
        stack = snapshot.held_stack
        fds = [layer.held for layer in stack if layer.held is not None]
        if len(fds) != len(stack):  # never dropped: that layer's files would just be missing
            raise SnapshotError("a layer of the snapshot is no longer held")
        return attrs.evolve(self.policy, workspace_lower_fd=fds[0], workspace_below_fds=fds[1:])

    def _check_fits(self, snapshot: TurnSnapshot) -> None:
        """Refuse a snapshot the turn's workspace could not hold as a copy.

        Under copy-on-write too: a turn that rewrites its files copies them up, and
        the same snapshot opens alike wherever it is opened.
        """
        limits = self.policy.limits
        inodes = limits.workspace_inodes
        if snapshot.total_bytes > limits.disk_mb * MIB or snapshot.file_count >= inodes:
            raise SnapshotError(
                f"the snapshot's {snapshot.file_count} names and {snapshot.total_bytes} bytes do "
                f"not fit this turn's workspace ({limits.disk_mb} MiB, {inodes} names: "
                "Limits.disk_mb)"
            )

    def _restore(self, session: SandboxSession, snapshot: TurnSnapshot) -> None:
        """Make the snapshot's files in a fresh sandbox's workspace, unless its server laid
        the workspace's overlay on the snapshot's tree (then they are there already)."""
        ready = getattr(session, "ready_info", None) or {}
        if (ready.get("relaxations") or {}).get("workspace_lower") is True:
            return
        plan = restore(snapshot, timeout=max(self.timeout_seconds, 30.0))
        try:
            request = next(plan)
        except StopIteration:
            return
        while True:
            reply = session.fs(request)
            try:
                request = plan.send(reply)
            except StopIteration:
                return

    def allowed(self, name: str) -> bool:
        """Whether the model may call ``name``: registered and within the granted scopes."""
        spec = self.registry.get(name)
        return spec is not None and spec.scope in self.scopes

    def tool_names(self) -> list[str]:
        """The tools the model may call under the granted scopes."""
        return self.registry.names(self.scopes)

    def _turn_context(self) -> TurnContext:
        """What a turn's runners may use of this executor, frozen as it is now."""
        agent = self.registry.agent
        return TurnContext(
            policy=self.policy,
            policy_id=self.policy.identity,
            backend=self.sandbox.name,
            output_chars=self.output_chars,
            fetcher=self.fetcher,
            searcher=self.searcher,
            services=dict(self.services),
            service_urls={n: s.url for n, s in agent.services.items()} if agent else {},
            transport=self.service_transport or _default_transport(),
        )

    def __repr__(self) -> str:
        return f"Executor({self.registry!r}, sandbox={self.sandbox!r})"


#: How many forks' sandboxes each ``Turn.fork`` starts ahead at a time (2 cores: a start
#: takes most of one), and how many forks' pools an executor keeps (the newest).
FORKS_AHEAD = 2
_AHEAD_POOLS = 2


#: The forks' pools by their snapshot's id: the snapshot (weakly) and its pool.
_AheadPools = collections.OrderedDict[int, tuple["weakref.ref[TurnSnapshot]", WarmPool]]


def _close_pools(pools: _AheadPools) -> None:
    while pools:
        pools.popitem()[1][1].close()


def _drop_pool(pools: _AheadPools, key: int, pool: WarmPool) -> None:
    """A forks' snapshot is gone: its pool goes, and its waiting sandboxes end."""
    if key in pools and pools[key][1] is pool:
        del pools[key]
    pool.close()


class Turn(BaseTurn[Executor]):
    """One turn: one sandbox, one workspace, any number of (concurrent) calls.

    The sandbox starts on the first call that needs it and ends with the turn. If
    it dies, the call that saw it die gets an error result saying the workspace is
    lost, and the turn's next call starts a fresh sandbox.
    """

    def __init__(self, executor: Executor, *, snapshot: TurnSnapshot | None = None) -> None:
        # Written out so that the documented signature names the public type.
        super().__init__(executor, snapshot=snapshot)


def _nothing() -> None:
    return None


def _fetcher(fetcher: Fetcher | None) -> Fetcher:
    if fetcher is not None:
        return fetcher
    from .web import Fetcher

    return Fetcher()


def _searcher(searcher: Searcher | SearchProvider | None) -> Searcher | None:
    from .web import Searcher

    if searcher is None or isinstance(searcher, Searcher):
        return searcher
    # A bare SearchProvider: wrap it so its results are checked and fenced.
    return Searcher(searcher)


_shared_transport: Transport | None = None


def _default_transport() -> Transport:
    """One stdlib transport for every executor without its own: it keeps no state."""
    global _shared_transport  # noqa: PLW0603 - one shared, stateless default
    if _shared_transport is None:
        from .web import StdlibTransport

        _shared_transport = StdlibTransport()
    return _shared_transport


def _resolve_backend(sandbox: Sandbox | str | None) -> Sandbox:
    if isinstance(sandbox, Sandbox):
        return sandbox
    from .sandbox._discovery import best_available, get_backend

    return best_available() if sandbox is None else get_backend(sandbox)
