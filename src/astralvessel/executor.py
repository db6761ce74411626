"""Executor and Turn: run a model's tool calls, one sandbox per turn.

The executor owns policy (which tools, which scopes, which mounts and limits);
a turn owns one running sandbox and its workspace. Every model mistake becomes a
``ToolResult`` with ``is_error``; only the host's mistakes raise.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from . import _exec
from ._aio import shielded, to_thread
from ._arguments import Refusal, check_arguments, parse_arguments, unknown_tool
from ._exec import Listing
from ._executor_args import (
    MountsArg,
    check_fetcher,
    check_limits,
    check_mounts,
    check_network_hosts,
    check_outbox_dir,
    check_output_chars,
    check_registry,
    check_scopes,
    check_searcher,
    check_services,
    check_snapshot,
    check_snapshot_budget,
    check_texts,
    check_timeout,
)
from ._ledger import Ledger
from ._network import WarmNetwork, admit_hosts, start_proxy, start_sandbox
from ._observe import TurnWatch, byte_size
from ._plans import Call, Plan, TurnContext
from ._refusals import Refusals
from ._runners import plan_call
from ._snapshot._capture import capture, restore
from ._snapshot._mechanism import overlay_backend
from ._snapshot._store import MIB, Budget
from ._snapshot._value import TurnSnapshot
from ._warm import WarmPool, check_warm
from .errors import SandboxError, SnapshotError, TurnClosedError, UsageError
from .results import ToolResult, render_refusal, render_sandbox_died, with_refusal_notes
from .sandbox._api import (
    DetachedProcess,
    DetachRequest,
    ExecRequest,
    ExecResult,
    FsReply,
    FsRequest,
)
from .sandbox._base import Sandbox, SandboxSession
from .sandbox._owner import Owner
from .sandbox._policy import WORKSPACE_DIR, Limits, Policy, Promise
from .sandbox._uids import UidRange
from .spec import ALL_SCOPES, Scope

if TYPE_CHECKING:
    from .registry import Registry
    from .web import AsyncTransport, Fetcher, Searcher, SearchProvider, Transport
    from .web._proxy import EgressProxy

__all__ = ["Executor", "Turn"]

_T = TypeVar("_T")


class Executor:
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
    ``snapshot_budget_mb`` bounds the snapshots this executor's turns take
    that are still alive (4096 MiB); one past it raises ``SnapshotError``.
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
        snapshot_budget_mb: int = 4096,
        snapshot: TurnSnapshot | None = None,
        ledger: Ledger | str | os.PathLike[str] | Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        registry = check_registry(registry)
        agent = registry.agent
        self.registry = registry
        self.sandbox = _resolve_backend(sandbox)
        self.scopes: frozenset[Scope] = (
            check_scopes(scopes)
            if scopes is not None
            else (agent.scopes if agent is not None and agent.scopes is not None else ALL_SCOPES)
        )
        self.timeout_seconds = check_timeout(timeout_seconds) or (
            agent.tool_timeout_seconds if agent else 30.0
        )
        self.output_chars = check_output_chars(output_chars) or (
            agent.tool_output_chars if agent else 30_000
        )
        self.policy = Policy(
            agent_dir=agent.path if agent is not None else None,
            dockerfile=agent.dockerfile if agent is not None else None,
            workdir=agent.workdir if agent is not None else WORKSPACE_DIR,
            mounts=check_mounts(mounts),
            limits=check_limits(limits) or (agent.limits if agent is not None else Limits()),
            outbox_dir=check_outbox_dir(outbox_dir),
            network_allow=network_allow
            if network_allow is not None
            else (agent.network_allow if agent is not None else ()),
            writable_root=_opted(
                "writable_root", writable_root, agent is not None and agent.writable_root
            ),
            root_identity=_opted(
                "root_identity", root_identity, agent is not None and agent.root_identity
            ),
            tool_servers=_opted(
                "tool_servers", tool_servers, agent is not None and agent.tool_servers
            ),
            uid_range=uid_range,
        ).relax(*check_texts("relax", relax))
        # The operator's pinned names reach the proxy (and webfetch) through the one fetcher.
        self.fetcher: Fetcher = admit_hosts(
            _fetcher(check_fetcher(fetcher)),
            check_network_hosts(network_hosts, self.policy.network_allow),
            self.policy.network_allow,
        )
        self.searcher: Searcher | None = _searcher(check_searcher(searcher))
        self.services: dict[str, Callable[..., Any]] = check_services(services)
        #: The web Transport service tools post through (the stdlib one when None).
        self.service_transport: Transport | AsyncTransport | None = service_transport
        #: The bytes of snapshots this executor's turns took that are still alive (its budget).
        self.snapshot_budget = Budget(check_snapshot_budget(snapshot_budget_mb) * MIB)
        #: The files every turn opened without a snapshot of its own starts with (warm ones too).
        self.snapshot: TurnSnapshot | None = check_snapshot(snapshot)
        #: Where each turn's records go (None: no ledger).
        self.ledger: Ledger | None = Ledger.of(ledger)
        self._warm: WarmPool | None = None
        self._release: Callable[[], None] = _nothing
        #: Starts warm sandboxes with their turns' egress proxies (a network and warm= only).
        self._network: WarmNetwork | None = None
        if check_warm(warm):
            self._warm = self._warm_pool(warm)
        if self._warm is not None:
            # Warm sandboxes of an executor nobody closed die when it is collected.
            self._release = weakref.finalize(self, self._warm.close)

    def _warm_pool(self, size: int) -> WarmPool:
        """The pool of ``size`` sandboxes started ahead, each with the executor's snapshot."""
        snapshot = self.snapshot
        policy = self._policy_for(snapshot)
        start: Callable[[], SandboxSession] = lambda: self.sandbox.start(policy)  # noqa: E731
        discard: Callable[[SandboxSession], None] = lambda session: session.close()  # noqa: E731
        if self.policy.network_allow:
            network = self._network = WarmNetwork(self.sandbox, policy, self.fetcher)
            start, discard = network.start, network.discard
        if snapshot is None:
            return WarmPool(self.sandbox, self.policy, size, start=start, discard=discard)

        def start_restored() -> SandboxSession:
            self._check_fits(snapshot)  # raised where the pool's starts raise, as a copy's was
            session = start()
            try:
                self._restore(session, snapshot)
            except BaseException:
                discard(session)
                raise
            return session

        return WarmPool(self.sandbox, self.policy, size, start=start_restored, discard=discard)

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

    async def aclose(self) -> None:
        """Async twin of ``close``; it finishes even when the caller is being cancelled."""
        # Shielded: under trio, or an anyio scope on asyncio, cancellation is level-triggered,
        # and the ``async with`` a cancel unwinds would otherwise leave the sandbox running.
        with shielded():
            await to_thread(self.close)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Executor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _start_session(
        self, proxy: EgressProxy | None = None, snapshot: TurnSnapshot | None = None
    ) -> tuple[SandboxSession, EgressProxy | None]:
        """A running sandbox for one turn, and the turn's egress proxy when it has a network.

        A warm sandbox if one is ready (with the proxy it was started with, and
        the executor's snapshot), else one started now, with ``snapshot``'s
        files. ``proxy`` is the turn's own when an earlier sandbox of the turn
        died: the turn keeps it, so its bounds stay the turn's.
        """
        pool = self._warm
        if proxy is None and pool is not None and pool.policy == self.policy:
            session = pool.take() if snapshot == self.snapshot else None
            if session is not None:
                network = self._network
                return session, None if network is None else network.claim(session)
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

    def _policy_for(self, snapshot: TurnSnapshot | None) -> Policy:
        """The policy a sandbox opened from ``snapshot`` starts with: the snapshot's tree
        as its workspace's lower layer, where the backend opens snapshots copy-on-write."""
        if snapshot is None or not overlay_backend(self.sandbox.name):
            return self.policy
        return attrs.evolve(self.policy, workspace_lower=snapshot.path)

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


class Turn:
    """One turn: one sandbox, one workspace, any number of (concurrent) calls.

    The sandbox starts on the first call that needs it and ends with the turn. If
    it dies, the call that saw it die gets an error result saying the workspace is
    lost, and the turn's next call starts a fresh sandbox.
    """

    def __init__(self, executor: Executor, *, snapshot: TurnSnapshot | None = None) -> None:
        self.executor = executor
        self._context = executor._turn_context()
        #: The files every sandbox of this turn starts with (None: an empty workspace).
        self.snapshot_source = snapshot
        self._session: SandboxSession | None = None
        #: The turn's egress proxy, started with its first sandbox when the policy allows a network.
        self._proxy: EgressProxy | None = None
        #: What ends its sandboxes and proxy if the turn is collected unclosed (_start_session).
        self._finalizers: list[weakref.finalize[[], Turn]] = []
        self._lock = threading.Lock()
        self._closed = False
        #: The process that started the turn's sandbox (None before it starts): in a child
        #: forked from it the turn is over, and its sandbox is left to the parent.
        self._owner: Owner | None = None
        #: What the turn tells the host: logs, its ledger, its spans.
        self._watch = TurnWatch(
            backend=self._context.backend,
            policy_id=self._context.policy_id,
            ledger=executor.ledger,
        )

    @property
    def turn_id(self) -> str:
        """This turn's id, as its log events and ledger records name it."""
        return self._watch.turn_id

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def close(self) -> None:
        """End the turn: kill everything in its sandbox and remove its workspace.

        In a process forked from the one that started the sandbox it only ends the
        turn there: the sandbox, its proxy and its outbox stay the parent's.
        """
        if self._forget_if_forked():
            return
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
            proxy, self._proxy = self._proxy, None
            finalizers, self._finalizers = self._finalizers, []
        for finalizer in finalizers:
            finalizer.detach()
        if session is not None:
            session.close()
        if proxy is not None:
            proxy.close()
        self._watch.closed()

    async def aclose(self) -> None:
        """Async twin of ``close``; it finishes even when the caller is being cancelled."""
        # Shielded: under trio, or an anyio scope on asyncio, cancellation is level-triggered,
        # and the ``async with`` a cancel unwinds would otherwise leave the sandbox running.
        with shielded():
            await to_thread(self.close)

    @property
    def session(self) -> SandboxSession:
        """The turn's running sandbox, started now if it has not been yet.

        Raises ``TurnClosedError`` once the turn has ended, and in a process forked
        after its sandbox started (the sandbox is the parent's; see ``sandbox._owner``).
        """
        self._refuse_if_forked()
        with self._lock:
            if self._closed:
                raise TurnClosedError("this turn has ended; open a new one with executor.turn()")
            if self._session is None:
                started = time.monotonic()
                self._session, self._proxy = self._start_session()
                self._owner = Owner()
                self._watch.sandbox_started(time.monotonic() - started, self._proxy)
            return self._session

    def _forget_if_forked(self) -> bool:
        """In a forked child, end the turn here without touching the parent's sandbox.

        Checked before the lock: a thread of the parent may have held it at the fork,
        and no thread of this process will release it.
        """
        owner = self._owner
        if owner is None or not owner.forked():
            return False
        self._closed = True
        self._session = self._proxy = None
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers = []
        return True

    def _refuse_if_forked(self) -> None:
        """``TurnClosedError`` in a child forked after the turn's sandbox started."""
        owner = self._owner
        if owner is not None and self._forget_if_forked():
            raise TurnClosedError(owner.refusal("this turn"))

    def _start_session(self) -> tuple[SandboxSession, EgressProxy | None]:
        """Start the turn's sandbox (and its proxy, the first time); the caller holds the lock."""
        session, proxy = self.executor._start_session(self._proxy, self.snapshot_source)
        # A turn dropped without close still ends its sandbox and stops its proxy's thread
        # when it is collected: each would otherwise live as long as the host. The callbacks
        # hold the session and proxy, never the turn. Not at exit: the sandbox dies with the
        # host process anyway, and the proxy's thread is a daemon.
        ends = (
            [session.close]
            if proxy is None or proxy is self._proxy
            else [session.close, proxy.close]
        )
        for end in ends:
            finalizer = weakref.finalize(self, end)
            finalizer.atexit = False
            self._finalizers.append(finalizer)
        return session, proxy

    async def _asession(self) -> SandboxSession:
        self._refuse_if_forked()
        with self._lock:
            if self._session is not None and not self._closed:
                return self._session
        return await to_thread(lambda: self.session)

    def _discard(self, session: SandboxSession, reason: str = "") -> None:
        """Forget a sandbox that died, so the next call starts a fresh one."""
        with self._lock:
            current = self._session is session
            if current:
                self._session = None
            closed = self._closed
        session.close()
        if current and not closed:
            self._watch.sandbox_lost(reason)

    # -- calls ----------------------------------------------------------------------------

    def call(self, name: str, arguments: object = None) -> ToolResult:
        """Run one tool call; ``arguments`` is a dict or the model's raw JSON text."""
        with self._watch.call(name, arguments) as note:
            started = time.monotonic()
            plan = self._plan(name, arguments)
            if isinstance(plan, ToolResult):
                note.result = self._stamp(plan, str(name), None, started)
                return note.result
            session = self.session if plan.sandboxed else None
            try:
                note.ran = outcome = plan.run(session)
            except Exception as exc:
                note.result = self._stamp(self._rescue(plan, session, exc), name, plan, started)
                return note.result
            note.result = self._stamp(plan.finish(outcome), name, plan, started)
            return note.result

    async def acall(self, name: str, arguments: object = None) -> ToolResult:
        """Async twin of ``call``; calls of one turn may run concurrently."""
        with self._watch.call(name, arguments) as note:
            started = time.monotonic()
            plan = self._plan(name, arguments)
            if isinstance(plan, ToolResult):
                note.result = self._stamp(plan, str(name), None, started)
                return note.result
            session = await self._asession() if plan.sandboxed else None
            try:
                note.ran = outcome = await plan.arun(session)
            except Exception as exc:
                note.result = self._stamp(self._rescue(plan, session, exc), name, plan, started)
                return note.result
            note.result = self._stamp(plan.finish(outcome), name, plan, started)
            return note.result

    # -- the host's own commands and files --------------------------------------------------

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``argv`` in the turn's sandbox, confined like a tool call; stdout and stderr apart.

        ``input`` is the command's stdin; ``cwd`` a sandbox path (relative to the
        workdir); ``env`` variables set over the clean environment; ``timeout``
        defaults to the turn's tool timeout. ``user`` (a name or uid, only
        under ``root_identity``) is who the command sees itself as, looked up
        in the sandbox's own ``/etc/passwd``: every user of a turn is the same
        host identity, so it changes what the command sees, never what it can
        reach; a user the sandbox does not know is a failed result (126). A
        command that fails or times out is a normal ``ExecResult``; the host's
        mistakes (a bad argv, a NUL, a value past its bound, ``user`` without
        ``root_identity``) raise ``UsageError``, and a sandbox that died raises
        ``SandboxError`` (the turn's next use starts a fresh one); closing the
        turn meanwhile raises ``TurnClosedError``. The bounds are in
        ``docs/exec-and-files.md``.
        """
        with self._watch.exec(_argv_of(argv)) as note:
            planned = self._drive(self._exec_plan(argv, input, cwd, env, timeout, user))
            if isinstance(planned, ExecResult):
                note.result = planned
                return planned
            session = self.session
            try:
                note.result = self._guarded(session, lambda: session.exec(planned))
            finally:
                self._drain_refusals()  # the host's command: logged, never noted on a later call
            return note.result

    async def aexec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Async twin of ``exec``; many may run at once, and cancelling one kills its command."""
        with self._watch.exec(_argv_of(argv)) as note:
            planned = await self._adrive(self._exec_plan(argv, input, cwd, env, timeout, user))
            if isinstance(planned, ExecResult):
                note.result = planned
                return planned
            session = await self._asession()
            try:
                note.result = await self._aguarded(session, lambda: session.aexec(planned))
            finally:
                self._drain_refusals()
            return note.result

    def start(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> DetachedProcess:
        """Start ``argv`` in the turn's sandbox and return once it runs, without waiting for it.

        Confined like a call (policy, limits, filter, memory watch), but it
        lives on after its command exits for as long as anything it started
        runs (a server that forks and exits keeps its daemon), until the turn
        closes, ``timeout`` seconds pass, or ``kill()``. At most
        ``DETACHED_PER_TURN`` (8) at once, each counted until everything it
        started has ended: one more raises ``UsageError``. Its stdout and stderr
        go to one log, of which the first 64 KiB are kept (``result().stdout``).
        See ``DetachedProcess`` and ``docs/exec-and-files.md``.
        """
        request = self._detach_request(argv, input, cwd, env, timeout)
        session = self.session
        return self._guarded(session, lambda: session.detach(request))

    async def astart(
        self,
        argv: Sequence[str],
        *,
        input: bytes | str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> DetachedProcess:
        """Async twin of ``start``."""
        request = self._detach_request(argv, input, cwd, env, timeout)
        session = await self._asession()
        return await self._aguarded(session, lambda: session.adetach(request))

    def _detach_request(
        self, argv: object, input: object, cwd: object, env: object, timeout: object
    ) -> DetachRequest:
        return _exec.detach_request(
            argv,
            input=input,
            cwd=cwd,
            env=env,
            timeout=timeout,
            workdir=str(self._context.policy.workdir),
        )

    def read_file(self, path: str) -> bytes:
        """The bytes of the file at sandbox ``path`` (absolute, or relative to the workdir).

        Resolved and confined like the built-in file tools, as the calls' user.
        Raises ``SandboxFileNotFoundError`` (a ``FileNotFoundError``),
        ``SandboxIsADirectoryError``, ``SandboxNotADirectoryError`` (a file on
        the way), ``SandboxPermissionError`` (outside the agent's data, or
        unreadable), ``FileTooLargeError`` past 100 MiB, and ``SandboxFileError``
        for a FIFO, socket or device (``EINVAL``) or a name too long.
        """
        with self._watch.file("read", path) as note:
            data = self._drive(_exec.read_plan(path, timeout=self._file_timeout()))
            note.size = len(data)
            return data

    async def aread_file(self, path: str) -> bytes:
        """Async twin of ``read_file``."""
        with self._watch.file("read", path) as note:
            data = await self._adrive(_exec.read_plan(path, timeout=self._file_timeout()))
            note.size = len(data)
            return data

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write ``data`` (str as UTF-8) to the file at sandbox ``path``, replacing it.

        Missing folders on the way are made. Only under the workspace and
        writable mounts; never through a link at the name. Raises
        ``SandboxPermissionError`` elsewhere (or on a read-only place, or a mode
        the calls' user may not write), ``SandboxIsADirectoryError`` for a folder
        (a mount point too), ``SandboxNotADirectoryError`` when a file stands
        where a folder should, ``SandboxFileError`` for a link at the name
        (``ELOOP``), a FIFO or socket (``EINVAL``), a name too long or a full
        disk, and ``UsageError`` past 100 MiB.
        """
        with self._watch.file("write", path) as note:
            note.size = byte_size(data)
            self._drive(_exec.write_plan(path, data, timeout=self._file_timeout()))

    async def awrite_file(self, path: str, data: bytes | str) -> None:
        """Async twin of ``write_file``."""
        with self._watch.file("write", path) as note:
            note.size = byte_size(data)
            await self._adrive(_exec.write_plan(path, data, timeout=self._file_timeout()))

    def list_dir(self, path: str = ".", *, limit: int = _exec.LIST_MAX_ENTRIES) -> Listing:
        """The entries of the folder at sandbox ``path``: ``(name, kind)`` in name order.

        ``kind`` is ``file``, ``dir``, ``link`` or ``other``. A ``Listing`` is a
        list; its ``truncated`` is true when the folder held more than ``limit``
        entries (1 to 10 000; ``UsageError`` outside), and then it holds
        ``limit`` of them, not chosen by name. A name that is not UTF-8 comes as
        ``os.listdir`` gives it (``os.fsdecode``'s escapes) and reaches the same
        file when passed back. Raises ``SandboxFileNotFoundError``,
        ``SandboxNotADirectoryError`` (a file), ``SandboxPermissionError``
        (outside the agent's data, or unlistable as the calls' user).
        """
        with self._watch.file("list", path) as note:
            listing = self._drive(_exec.list_plan(path, timeout=self._file_timeout(), limit=limit))
            note.size = len(listing)
            return listing

    async def alist_dir(self, path: str = ".", *, limit: int = _exec.LIST_MAX_ENTRIES) -> Listing:
        """Async twin of ``list_dir``."""
        with self._watch.file("list", path) as note:
            plan = _exec.list_plan(path, timeout=self._file_timeout(), limit=limit)
            listing = await self._adrive(plan)
            note.size = len(listing)
            return listing

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> TurnSnapshot:
        """The turn's files now, as an immutable value: open turns from it with
        ``executor.turn(snapshot=...)``, or ``save`` it.

        Files, not processes: the workspace (the per-call outbox aside), taken
        between calls. Not captured: running or detached processes (they keep
        running; a file one writes meanwhile may be caught half-written, or
        refuse the snapshot if it changes while read), the egress proxy's
        connections, the leased identity, the host's mounts. It counts against
        the executor's ``snapshot_budget_mb`` while it is alive. Raises
        ``SnapshotError`` for files a snapshot cannot keep (a fifo, a socket, a
        device, more names or bytes than the bounds) and ``UsageError`` under
        ``writable_root``, whose root's changes are not captured.
        """
        unchanged = self._unchanged_source()
        return unchanged if unchanged is not None else self._drive(self._capture_plan())

    async def asnapshot(self) -> TurnSnapshot:
        """Async twin of ``snapshot``."""
        unchanged = self._unchanged_source()
        return unchanged if unchanged is not None else await self._adrive(self._capture_plan())

    def _unchanged_source(self) -> TurnSnapshot | None:
        """The snapshot the turn opened from while no sandbox of it runs: its files are still
        that snapshot's (a sandbox that died is replaced by one restored from it)."""
        with self._lock:
            if self._session is None and not self._closed:
                return self.snapshot_source
        return None

    def fork(self, n: int) -> list[Turn]:
        """``n`` new turns whose files start as this turn's now; this turn goes on.

        One snapshot, then ``n`` turns opened from it, each with its own sandbox
        (started on its first use), identity, limits and workspace: a fork's
        writes reach neither its siblings nor this turn. Processes are not
        carried. Raises what ``snapshot`` raises.
        """
        count = _fork_count(n)
        snapshot = self.snapshot()
        return [Turn(self.executor, snapshot=snapshot) for _ in range(count)]

    async def afork(self, n: int) -> list[Turn]:
        """Async twin of ``fork``."""
        count = _fork_count(n)
        snapshot = await self.asnapshot()
        return [Turn(self.executor, snapshot=snapshot) for _ in range(count)]

    def _capture_plan(self) -> Generator[FsRequest, FsReply, TurnSnapshot]:
        policy = self._context.policy
        if policy.writable_root:
            raise UsageError(
                "Turn.snapshot: a turn with writable_root changes its root too, which a "
                "snapshot does not capture yet; snapshot a turn without it"
            )
        budget = self.executor.snapshot_budget
        return capture(
            timeout=self._file_timeout(),
            max_bytes=budget.limit_bytes,
            max_files=policy.limits.workspace_inodes,
            budget=budget,
        )

    def _exec_plan(  # noqa: PLR0917 - exec's own arguments, passed on as they came
        self, argv: object, input: object, cwd: object, env: object, timeout: object, user: object
    ) -> Generator[FsRequest, FsReply, ExecRequest | ExecResult]:
        policy = self._context.policy
        request = _exec.exec_request(
            argv,
            input=input,
            cwd=cwd,
            env=env,
            timeout=timeout,
            default_timeout=self.executor.timeout_seconds,
            workdir=str(policy.workdir),
        )
        return _exec.exec_plan(
            request, user, root_identity=policy.root_identity, timeout=self._file_timeout()
        )

    def _file_timeout(self) -> float:
        return max(self.executor.timeout_seconds, 30.0)

    def _guarded(self, session: SandboxSession, step: Callable[[], _T]) -> _T:
        """Run one session step; a sandbox that died is discarded and its error raised."""
        try:
            return step()
        except SandboxError as error:
            self._lost(session, error)
            raise

    async def _aguarded(self, session: SandboxSession, step: Callable[[], Awaitable[_T]]) -> _T:
        """Async twin of ``_guarded``: every async step of the host API goes through it."""
        try:
            return await step()
        except SandboxError as error:
            self._lost(session, error)
            raise

    def _lost(self, session: SandboxSession, error: SandboxError) -> None:
        """Discard the sandbox a step lost; raise ``TurnClosedError`` if the turn was closed.

        A turn closed while the step ran (from another thread or task) is the
        host's own doing, not a failed sandbox: that step raises
        ``TurnClosedError``, as any later use of the turn does.
        """
        self._discard(session, str(error))
        with self._lock:
            closed = self._closed
        if closed:
            raise TurnClosedError(
                "this turn was closed while the command or file operation ran; "
                "open a new one with executor.turn()"
            ) from error

    def _drive(self, plan: Generator[FsRequest, FsReply, _T]) -> _T:
        """Run a file plan's steps on the session (the sync driver)."""
        try:
            request = next(plan)  # checks the host's arguments before a sandbox starts
        except StopIteration as done:  # a plan that needs no step
            return done.value  # type: ignore[no-any-return]
        session = self.session
        while True:
            reply = self._guarded(session, lambda r=request: session.fs(r))  # type: ignore[misc]
            try:
                request = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    async def _adrive(self, plan: Generator[FsRequest, FsReply, _T]) -> _T:
        """Run a file plan's steps on the session (the async driver)."""
        try:
            request = next(plan)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        session = await self._asession()
        while True:
            reply = await self._aguarded(session, lambda r=request: session.afs(r))  # type: ignore[misc]
            try:
                request = plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def _plan(self, name: str, arguments: object) -> Plan[Any] | ToolResult:
        """Check the call and choose its runner (pure but for the registry lookup)."""
        executor = self.executor
        if not isinstance(name, str) or not executor.allowed(name):
            return render_refusal(unknown_tool(name, executor.tool_names()))
        spec = executor.registry[name]
        try:
            args = parse_arguments(name, arguments)
            check_arguments(spec, args)
        except Refusal as refusal:
            return render_refusal(str(refusal))
        timeout = spec.timeout_seconds or executor.timeout_seconds
        return plan_call(self._context, spec, Call(tool=name, arguments=args, timeout=timeout))

    def _rescue(
        self, plan: Plan[Any], session: SandboxSession | None, exc: Exception
    ) -> ToolResult:
        """The result for a call whose step raised, or the exception again if it is the host's."""
        if isinstance(exc, SandboxError) and session is not None:
            # The sandbox died (or broke protocol): this call cannot be retried in it,
            # and every later call would fail the same way.
            self._discard(session, str(exc))
            return render_sandbox_died(str(exc))
        result = plan.rescue(exc)
        if result is None:
            raise exc
        return result

    def _stamp(
        self, result: ToolResult, name: str, plan: Plan[Any] | None, started: float
    ) -> ToolResult:
        """Every result names its tool and duration; one that ran in the sandbox, which one,
        and the connections the turn's egress proxy refused while it ran."""
        sandboxed = plan is not None and plan.sandboxed
        if sandboxed:
            result = with_refusal_notes(result, self._drain_refusals())
        return attrs.evolve(
            result,
            tool=name,
            duration=result.duration or time.monotonic() - started,
            backend=self._context.backend if sandboxed else None,
            policy_id=self._context.policy_id if sandboxed else None,
        )

    def _drain_refusals(self) -> Refusals:
        """What the turn's proxy refused since the last call ended (nothing without a proxy).

        The proxy serves the whole turn: under concurrent calls, a refusal goes to
        whichever call ends first after it.
        """
        proxy = self._proxy
        return Refusals() if proxy is None else proxy.drain()


def _fork_count(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"Turn.fork takes a whole number of turns above 0, not {n!r}")
    return n


def _nothing() -> None:
    return None


def _argv_of(argv: object) -> Sequence[object]:
    """``argv`` as the watch names it (the checks that refuse a bad one come after)."""
    return argv if isinstance(argv, (list, tuple)) else ()


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


def _opted(name: str, asked: object, agent_default: bool) -> bool:
    """The host's explicit choice of the eval relaxation ``name``, else the agent's;
    ``UsageError`` if the choice is not a bool."""
    if asked is None:
        return agent_default
    if not isinstance(asked, bool):
        raise UsageError(f"{name} is True, False or None (the agent's setting), not {asked!r}")
    return asked


def _resolve_backend(sandbox: Sandbox | str | None) -> Sandbox:
    if isinstance(sandbox, Sandbox):
        return sandbox
    from .sandbox._discovery import best_available, get_backend

    return best_available() if sandbox is None else get_backend(sandbox)
