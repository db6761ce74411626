"""Warm turns on a Ray cluster: turn actors started ahead on each node, their sandboxes running.

Locally a warm pool keeps sandboxes. On Ray a sandbox belongs to the worker
process that started it (its pipes, its lifeline thread) and cannot move to
another, so what waits is a whole turn: a turn's actor placed on a node with
its sandbox already started there. Opening a turn takes one; that also saves
the actor's own start (a Ray worker process), which is most of a remote turn's
start. A waiting turn has run no call; it serves exactly one turn and dies with
it, as a turn started cold does.

``warm=N`` keeps N on every node that can hold the executor's turns: the
nodes alive when the executor is made that offer every resource its
``actor_options`` ask for. A rollout system sizes its concurrency per node, so
the pool grows with the cluster, and taking from the node with the most ready
keeps turns spread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import UsageError

__all__ = ["WarmTurns", "pool_nodes"]

#: How long the set of alive nodes is trusted before asking the cluster again.
ALIVE_SECONDS = 1.0
#: How long ``close`` waits for the waiting turns to end their sandboxes before killing them.
CLOSE_WAIT = 30.0
#: Actor options that ask for a node resource, and the resource's name in ``ray.nodes()``.
RESOURCE_OF_OPTION = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def pinned_node(strategy: object) -> str | None:
    """The node a scheduling strategy pins turns to; None for a named strategy (SPREAD...).

    Warm turns are placed per node by the pool itself, so a strategy that is
    neither a name nor a node affinity (a placement group) cannot be honoured.
    """
    if strategy is None or isinstance(strategy, str):
        return None
    node = getattr(strategy, "node_id", None)
    if isinstance(node, str):
        return node
    raise UsageError(
        f"RayExecutor(warm=) places warm turns on nodes itself and cannot follow {strategy!r}; "
        "choose the nodes with actor_options={'resources': {...}} or a node affinity instead"
    )


def pool_nodes(nodes: Iterable[Mapping[str, Any]], actor_options: Mapping[str, Any]) -> list[str]:
    """The ids of the alive nodes (``ray.nodes()`` entries) that can hold a turn's actor."""
    wanted: dict[str, float] = {
        RESOURCE_OF_OPTION[option]: float(amount)
        for option, amount in actor_options.items()
        if option in RESOURCE_OF_OPTION and amount
    }
    wanted.update(actor_options.get("resources") or {})
    pinned = pinned_node(actor_options.get("scheduling_strategy"))
    return [
        node["NodeID"]
        for node in nodes
        if node.get("Alive")
        and pinned in (None, node["NodeID"])
        and all(node.get("Resources", {}).get(name, 0) >= need for name, need in wanted.items())
    ]


@attrs.frozen
class Waiting:
    """One turn started ahead: its node, its actor, and the reference its start answers on."""

    node: str
    actor: Any
    started: Any


class WarmTurns:
    """``size`` turn actors per node of ``nodes``, each with its sandbox started, for one executor.

    ``start(node)`` places one turn's actor on ``node`` (the executor's actor
    options, pinned there). ``take`` never waits for a start: it hands out a
    turn whose start is done or None, and the caller places a turn cold. Each
    take starts one replacement on the taken turn's node, so a start that fails
    (a backend that cannot run there) is retried once per turn, never in a loop.
    """

    def __init__(self, start: Callable[[str], Any], nodes: Sequence[str], size: int) -> None:
        self.size = size
        self._start = start
        self._lock = threading.Lock()
        self._closed = False
        self._alive: frozenset[str] = frozenset(nodes)
        self._alive_at = time.monotonic()
        self._waiting: list[Waiting] = [self._launch(node) for node in nodes for _ in range(size)]

    @property
    def waiting(self) -> list[Waiting]:
        """The turns started ahead and not yet taken (their starts may still be under way)."""
        with self._lock:
            return list(self._waiting)

    def _launch(self, node: str) -> Waiting:
        actor = self._start(node)
        return Waiting(node=node, actor=actor, started=actor.start.remote())

    def take(self) -> Any | None:
        """The actor of a turn started ahead on a node still alive, or None when none is ready."""
        ray = _ray()
        while True:
            with self._lock:
                if self._closed or not self._waiting:
                    return None
                lost = self._forget_lost_nodes()
                refs = [w.started for w in self._waiting]
                done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
                chosen = _pick([w for w in self._waiting if w.started in done])
                if chosen is not None:
                    self._waiting.remove(chosen)
                    self._waiting.append(self._launch(chosen.node))
            release(w.actor for w in lost)
            if chosen is None:
                return None
            try:
                failure = ray.get(chosen.started, timeout=0)
            except Exception:
                # The actor died (its node with it) after it started: take another.
                release([chosen.actor])
                continue
            if failure is not None:
                # The sandbox could not start there: the turn started cold raises the error.
                release([chosen.actor])
                return None
            return chosen.actor

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Block until every waiting turn's start is done; False if ``timeout`` passed first.

        Raises the host's error a start returned (the sandbox could not start).
        """
        ray = _ray()
        refs = [w.started for w in self.waiting]
        if not refs:
            return not self._closed
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in done:
            try:
                failure = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # a node lost: ``take`` forgets its turns
            if failure is not None:
                raise failure
        return not pending and not self._closed

    def close(self) -> None:
        """End every waiting turn (its sandbox, then its actor), on every node. Idempotent."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        release(w.actor for w in waiting)

    def _forget_lost_nodes(self) -> list[Waiting]:
        """Drop (and return) the waiting turns of nodes the cluster lost; holding the lock."""
        now = time.monotonic()
        if now - self._alive_at >= ALIVE_SECONDS:
            self._alive = frozenset(n["NodeID"] for n in _ray().nodes() if n.get("Alive"))
            self._alive_at = now
        lost = [w for w in self._waiting if w.node not in self._alive]
        if lost:
            self._waiting = [w for w in self._waiting if w.node in self._alive]
        return lost


def _pick(ready: Sequence[Waiting]) -> Waiting | None:
    """The ready turn of the node that has the most ready: warm turns stay spread."""
    if not ready:
        return None
    per_node: dict[str, int] = {}
    for waiting in ready:
        per_node[waiting.node] = per_node.get(waiting.node, 0) + 1
    return max(ready, key=lambda w: per_node[w.node])


def release(actors: Iterable[Any]) -> None:
    """End turn actors: let each close its turn while it can answer, then kill it.

    Every close is sent at once and waited for together, so a node that is gone
    costs one ``CLOSE_WAIT`` at most, not one per turn.
    """
    ray = _ray()
    actors = list(actors)
    closing = []
    for actor in actors:
        with contextlib.suppress(Exception):
            closing.append(actor.close.remote())
    if closing:
        with contextlib.suppress(Exception):
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_WAIT)
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor)


def _ray() -> Any:
    import ray

    return ray
