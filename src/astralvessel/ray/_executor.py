"""RayExecutor and RayTurn: the Executor and Turn API, each turn held by an actor on one node.

The host keeps the model-facing side (which tool, which arguments, what text
comes back); a turn's sandbox lives on the Ray node that placed its actor. A
node lost mid-turn (the actor dies, the node is gone, or no answer comes within
the call's timeout plus a grace) costs the call an error result, as a dead
sandbox does locally, and the turn's next call starts a new actor, placed anew.
With ``warm=N`` the executor keeps turns started ahead on each node (``_warm``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .._executor._closing import Closing, refuse_if_ended
from .._executor._observe import TurnWatch
from .._executor._settings import check_mount_items, check_registry, check_snapshot, settings_from
from .._executor._snapshot._value import TurnSnapshot
from .._ground import _log
from .._ground._aio import wait_future
from .._ground._ledger import Ledger
from .._ground._suggest import install_extra
from ..errors import BackendUnavailableError, UsageError
from ..registry import Registry
from ..results import OutboxFile, ToolResult, render_sandbox_died
from ..sandbox._base import Sandbox
from ..sandbox._temporary_outbox import TurnOutbox
from ._auth import token_auth_hint
from ._host import NodeSettings, TurnHost
from ._ship import pack_agent
from ._warm import WarmTurns, pool_nodes, release

__all__ = ["RayExecutor", "RayTurn"]

#: How long past a call's own timeout the host waits for its node before calling it lost.
CALL_GRACE = 60.0
#: Threads of one turn's actor: calls of one turn may run concurrently, as locally.
TURN_CONCURRENCY = 32


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError(
            f"astralvessel.ray needs Ray: install it with {install_extra('ray')}"
        ) from exc
    return ray


def _join(ray: Any, address: str | None) -> None:
    """Join the cluster at ``address`` (None: ``RAY_ADDRESS``'s, or a new local one).

    Raises ``BackendUnavailableError`` when Ray cannot start here because its own
    sockets' paths are too long, or cannot join a cluster that refused this
    process's token (``_auth``), and Ray's own errors otherwise.
    """
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except ConnectionError as exc:
        hint = token_auth_hint(exc, os.environ, Path.home())
        if hint is None:
            raise
        raise BackendUnavailableError(f"{exc}; {hint}") from exc
    except OSError as exc:
        # Ray's session folder (and its sockets) go under $RAY_TMPDIR, else $TMPDIR, and Ray
        # binds them by path: a long TMPDIR (a CI runner's, a job scheduler's) stops it cold.
        if "AF_UNIX path length" not in str(exc):
            raise
        raise BackendUnavailableError(
            "Ray cannot start its local node here: it puts its session folder under "
            "$RAY_TMPDIR, else $TMPDIR, and its sockets' paths there are longer than a unix "
            f"socket's address holds ({exc}). Set RAY_TMPDIR to a short folder "
            "(RAY_TMPDIR=/tmp/ray), or start Ray with one (`ray start --head "
            "--temp-dir=/tmp/ray`, or `ray.init(_temp_dir=...)` before RayExecutor)"
        ) from exc


@functools.cache
def _actor_class() -> Any:
    """``TurnHost`` as a Ray actor class (made once; Ray is imported only when used)."""
    return _ray().remote(TurnHost)


class RayExecutor(Closing):
    """An ``Executor`` whose turns each run on one node of a Ray cluster.

    ``address`` is the cluster to join (``ray.init(address=...)``) when this
    process has not joined one yet; None joins the one ``RAY_ADDRESS`` names or
    starts a local one. ``sandbox`` is a backend name or a zero-argument
    callable that builds the backend (a class such as ``Bubblewrap``), resolved
    on each node. The agent folder is shipped to the nodes; ``mounts`` must
    exist at the same paths on every node (see ``docs/scaling.md``).
    ``actor_options`` go to each turn's actor (``resources``,
    ``scheduling_strategy``...); turns are spread over the nodes by default.
    ``outbox_dir`` is where the files calls leave in the outbox land on this
    host, one folder per turn, and stay; without it they go to a folder of
    the turn, removed once it has ended and no result naming its files is left
    (as ``Executor``'s). ``warm`` keeps that many turns started
    ahead on each node that can hold this executor's turns (alive now, and
    offering the resources ``actor_options`` ask for): opening a turn takes one,
    its actor placed and its sandbox running, and each still serves exactly one
    turn; ``close()`` (or leaving ``with``) ends the ones still waiting, on
    every node. Every other keyword is an ``Executor`` option, applied on the node.
    A wrong value for any argument (or a keyword ``Executor`` does not take)
    raises ``UsageError`` naming it here, before any Ray call, as ``Executor`` does;
    only what a node alone can know (a mount's host path there) is checked there.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        sandbox: str | Callable[[], Sandbox] | None = None,
        mounts: Mapping[str, str | Path] | None = None,
        address: str | None = None,
        actor_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        # Every argument is checked here, before any Ray call: on a node a wrong one would
        # fail late (a turn's first call) or never.
        registry = check_registry(registry, "RayExecutor")
        _check_backend(sandbox)
        settings = settings_from(options, "RayExecutor")
        node_mounts = {} if mounts is None else check_mount_items(mounts)
        if address is not None and not isinstance(address, str):
            raise UsageError(f"address is a Ray cluster's address as text, not {address!r}")
        if actor_options is not None and not isinstance(actor_options, Mapping):
            raise UsageError(
                f"actor_options maps Ray actor options to values, not {actor_options!r}"
            )
        #: Where each turn's records go, written on this host (``Executor(ledger=)``'s values).
        self.ledger: Ledger | None = settings.ledger
        #: Where outbox files land on this host (kept); None: a folder per turn, removed once it
        #: is closed and no result names its files.
        self.outbox_dir: Path | None = settings.outbox_dir
        self.registry = registry
        agent = registry.agent
        self.timeout_seconds: float = settings.timeout_for(agent)
        settings.hosts_for(settings.network_allow_for(agent))
        #: The backend each node builds: its name, or a callable that builds it there.
        self.sandbox = sandbox
        ray = _ray()
        if not ray.is_initialized():
            _join(ray, address)
        # The ledger, the outbox and the warm turns are this host's; a node gets the rest.
        node = NodeSettings(
            settings=attrs.evolve(settings, ledger=None, outbox_dir=None, warm=0),
            sandbox=sandbox,
            mounts=node_mounts,
        )
        self._actor_options: dict[str, Any] = {
            "scheduling_strategy": "SPREAD",
            # A turn's actor only waits on its sandbox, whose work Ray does not see. Without
            # this, an actor that names a custom resource holds a whole CPU for its life
            # (Ray's default), so a one-CPU node would hold one turn at a time.
            "num_cpus": 0,
            "max_concurrency": TURN_CONCURRENCY,
            "max_restarts": 0,
            **(actor_options or {}),
        }
        self._launcher = _Launcher(
            actor_options=self._actor_options,
            # Put once in the object store: each turn's actor fetches them from there.
            registry_ref=ray.put(registry),
            node=node,
            agent_ref=None if agent is None else ray.put(pack_agent(agent.path)),
            ran_chars=None if self.ledger is None else self.ledger.max_chars,
        )
        self._warm: WarmTurns | None = None
        self._release: Callable[[], object] = _nothing
        #: The last snapshot put in the object store (its content id and reference).
        self._snapshot_ref: tuple[str, Any] | None = None
        self._snapshot_lock = threading.Lock()
        if settings.warm:
            nodes = pool_nodes(ray.nodes(), self._actor_options)
            if not nodes:
                raise UsageError(
                    "RayExecutor(warm=) found no alive node offering what actor_options ask for "
                    f"({self._actor_options.get('resources') or 'a CPU'}); start one first"
                )
            # The pool holds the launcher, never the executor, so the executor can be collected.
            self._warm = WarmTurns(self._launcher.start_on, nodes, settings.warm)
            # Waiting turns of an executor nobody closed end when it is collected.
            self._release = weakref.finalize(self, self._warm.close)

    def turn(self, snapshot: TurnSnapshot | None = None) -> RayTurn:
        """Open one turn: a context manager (``with`` or ``async with``) on one node.

        Given a ``snapshot``, the turn's workspace starts as its files on
        whichever node the turn lands: the snapshot travels through Ray's object
        store as its saved form and is checked there as any loaded file. Such a
        turn starts its own actor (warm turns start empty).
        """
        return RayTurn(self, snapshot=check_snapshot(snapshot))

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until every warm turn has its sandbox started; False if ``timeout`` passed first.

        Without ``warm`` there is nothing to wait for (True). Raises the host's
        error when a node could not start a sandbox.
        """
        pool = self._warm
        return pool is None or pool.wait_filled(timeout)

    def close(self) -> None:
        """End the warm turns still waiting, on every node; turns opened after it start cold.

        Open turns are not touched: each releases its own actor when it ends.
        """
        self._warm = None
        self._release()

    def _deadline(self, name: str) -> float:
        """How long the host waits for a call of ``name`` before calling its node lost."""
        spec = self.registry.get(name) if isinstance(name, str) else None
        timeout = (spec.timeout_seconds if spec is not None else None) or self.timeout_seconds
        return timeout + CALL_GRACE

    def _place(self, snapshot: TurnSnapshot | None = None) -> Any:
        """A turn's actor: one started ahead if one is ready, else one placed now."""
        if snapshot is not None:
            return self._launcher.start(snapshot=self._stored(snapshot))
        pool = self._warm
        actor = None if pool is None else pool.take()
        _log.event(_log.RAY, "ray.placed", {"warm": actor is not None})
        return actor if actor is not None else self._launcher.start()

    def _stored(self, snapshot: TurnSnapshot) -> Any:
        """The snapshot's object-store reference, put once for the turns opened from it."""
        with self._snapshot_lock:
            kept = self._snapshot_ref
            if kept is None or kept[0] != snapshot.content_id:
                kept = self._snapshot_ref = (snapshot.content_id, _ray().put(snapshot))
            return kept[1]

    def __repr__(self) -> str:
        return f"RayExecutor({self.registry!r}, sandbox={self.sandbox!r})"


@attrs.frozen
class _Launcher:
    """How a turn's actor starts: the executor's options and object-store references."""

    actor_options: Mapping[str, Any]
    registry_ref: Any
    node: NodeSettings
    agent_ref: Any
    #: The host ledger's ``max_chars``, so the node returns its sandbox answers; None: none.
    ran_chars: int | None = None

    def start(self, *, snapshot: Any = None, **placement: Any) -> Any:
        """A turn's actor, placed by the executor's actor options (and ``placement`` over them);
        ``snapshot`` is the object-store reference of the files its turn starts with."""
        actor = _actor_class().options(**{**self.actor_options, **placement})
        return actor.remote(self.registry_ref, self.node, self.agent_ref, snapshot, self.ran_chars)

    def start_on(self, node: str) -> Any:
        """A turn's actor on ``node`` and nowhere else (a warm turn of that node's pool)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self.start(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        )


@attrs.frozen
class _Sent:
    """One call on its way: the actor it went to, the reply's reference, how long to wait."""

    actor: Any
    reply: Any
    timeout: float


class RayTurn(Closing):
    """One turn on one Ray node: ``call`` and ``acall`` as ``Turn``'s; results name the node."""

    def __init__(self, executor: RayExecutor, *, snapshot: TurnSnapshot | None = None) -> None:
        self.executor = executor
        #: The files the turn starts with on its node (None: an empty workspace).
        self.snapshot_source = snapshot
        self._actor: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._turn_outbox = TurnOutbox(executor.outbox_dir, "ray-outbox")
        self._calls = 0
        backend = executor.sandbox
        #: Its log events, ledger records and spans, on this host (the node stamps the policy).
        self._watch = TurnWatch(
            backend=f"ray:{backend if isinstance(backend, str) else 'default'}",
            policy_id=None,
            ledger=executor.ledger,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """End the turn on its node (its sandbox and workspace) and release the actor."""
        with self._lock:
            self._closed = True
            actor, self._actor = self._actor, None
        if actor is not None:
            release([actor])
        self._turn_outbox.close()
        self._watch.closed()

    @property
    def node(self) -> str:
        """The id of the Ray node holding this turn (placing its actor now if need be)."""
        actor = self._handle()
        node: str = _ray().get(actor.node_id.remote(), timeout=CALL_GRACE)
        return node

    def _handle(self) -> Any:
        with self._lock:
            refuse_if_ended(self._closed)
            if self._actor is None:
                self._actor = self.executor._place(self.snapshot_source)
            return self._actor

    # -- calls ----------------------------------------------------------------------------

    def call(self, name: str, arguments: object = None) -> ToolResult:
        """Run one tool call on the turn's node; ``arguments`` is a dict or the model's JSON."""
        with self._watch.call(name, arguments) as note:
            started = time.monotonic()
            sent = self._send(name, arguments)
            try:
                reply = _ray().get(sent.reply, timeout=sent.timeout)
            except Exception as exc:
                note.result = self._failed(sent, name, exc, started)
                return note.result
            note.result, note.ran = self._land(reply)
            return note.result

    async def acall(self, name: str, arguments: object = None) -> ToolResult:
        """Async twin of ``call``; calls of one turn may run concurrently."""
        with self._watch.call(name, arguments) as note:
            started = time.monotonic()
            sent = self._send(name, arguments)
            try:
                # A Ray reference is an asyncio awaitable only: its future serves any event loop.
                reply = await wait_future(sent.reply.future(), sent.timeout)
            except Exception as exc:
                note.result = self._failed(sent, name, exc, started)
                return note.result
            note.result, note.ran = self._land(reply)
            return note.result

    def _send(self, name: str, arguments: object) -> _Sent:
        actor = self._handle()
        return _Sent(
            actor=actor,
            reply=actor.call.remote(name, arguments),
            timeout=self.executor._deadline(name),
        )

    def _failed(self, sent: _Sent, name: str, exc: Exception, started: float) -> ToolResult:
        """The host's own error raised again; a lost node as the call's error result."""
        ray = _ray()
        if isinstance(exc, ray.exceptions.RayTaskError):
            # The call itself raised on the node: a host mistake, raised as itself here.
            raise exc.cause from None
        if not isinstance(exc, ray.exceptions.RayError | TimeoutError):
            raise exc
        with self._lock:
            lost = self._actor is sent.actor
            if lost:
                self._actor = None
        if lost:
            # A lost node has nothing left to close.
            with contextlib.suppress(Exception):
                ray.kill(sent.actor)
        why = (
            f"no answer from its Ray node within {sent.timeout:g} s"
            if isinstance(exc, TimeoutError)
            else f"its Ray node was lost: {type(exc).__name__}"
        )
        return attrs.evolve(
            render_sandbox_died(why), tool=name, duration=time.monotonic() - started
        )

    def _land(
        self, reply: tuple[ToolResult, dict[str, bytes], dict[str, Any] | None]
    ) -> tuple[ToolResult, dict[str, Any] | None]:
        """The node's result, its outbox files written to this host's disk, and its sandbox's
        answer for the ledger."""
        result, contents, ran = reply
        if not contents:
            return result, ran
        with self._lock:
            self._calls += 1
            calls = self._calls
        folder = self._turn_outbox.root() / f"call-{calls}"
        folder.mkdir()
        files = []
        for entry in result.files:
            path = folder / entry.name
            path.write_bytes(contents[entry.name])
            files.append(
                self._turn_outbox.adopt(OutboxFile(name=entry.name, size=entry.size, path=path))
            )
        return attrs.evolve(result, files=tuple(files)), ran


def _check_backend(sandbox: object) -> None:
    """``UsageError`` unless ``sandbox`` is a backend's name, a callable building one, or None."""
    if isinstance(sandbox, Sandbox):
        raise UsageError(
            "RayExecutor builds the backend on each node: pass its name "
            f"({sandbox.name!r}) or its class, not an instance"
        )
    if sandbox is not None and not isinstance(sandbox, str) and not callable(sandbox):
        raise UsageError(
            "RayExecutor's sandbox is a backend's name or a callable that builds one (its "
            f"class), not {sandbox!r}"
        )


def _nothing() -> None:
    return None
