"""A fork that adopts one of the executor's warm sandboxes (``Executor(warm=N)``).

A warm sandbox is started before anyone forks, with an empty workspace. A fork can
still take it: the host hands its server the fork's frozen layer (a detached mount,
over the socket the sandbox was started with: ``Policy.adoptable``), or a fork of a
fork's stack of layers, every one, top first, and the server lays the workspace's
overlay on them as a fork's own sandbox would at its start. The
fork's first call then costs what a warm turn's does, not a sandbox's start. On
Docker the socket came with the sandbox's hello, and the backend makes each layer the
sandbox's uid's first (``ServerSession.fit_layer``: ``sandbox/docker/_adoption``).

Only a sandbox nothing has touched is offered (the server refuses any other), and a
refusal or any failure closes that sandbox: the fork then opens as it would without
a warm pool. Not under a network (each sandbox's proxy is its turn's), nor where the
executor's own snapshot fills its warm sandboxes' workspaces.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

import attrs

from .._ground import _log
from .._ground._mounts import detached_clone
from ..errors import SandboxError
from ..sandbox._base import SandboxSession
from ..sandbox._policy import Policy
from ..sandbox._session import ServerSession
from ..sandbox.server._messages import MAX_LAYERS
from ._snapshot._mechanism import adopts_stack, adopts_warm
from ._snapshot._value import TurnSnapshot
from ._warm import ADOPTED_SETTLE, WarmPool

__all__ = ["adopt_warm", "adoptable", "warm_policy"]

#: Seconds a server may take to lay a fork's layer (a few milliseconds, as a rule).
ADOPT_WAIT = 10.0


def warm_policy(backend: str, policy: Policy, snapshot: TurnSnapshot | None) -> Policy:
    """The policy an executor's warm sandboxes start with: adoptable by a fork where the
    backend can hand a layer over later and the warm workspace starts empty."""
    if not adopts_warm(backend) or policy.network_allow or snapshot is not None:
        return policy
    return attrs.evolve(policy, adoptable=True)


def adoptable(snapshot: TurnSnapshot, backend: str) -> bool:
    """Whether the host can hand a server ``snapshot``'s files as layers: a frozen layer
    an ordinary user holds, or, as root, any tree of the store (cloned); a stack of
    layers (a fork of a fork's, ``Tree.stacked``) where ``backend``'s sandboxes take one
    (``adopts_stack``), every layer held or staged (root's Docker host lays the overlay
    itself, ``docker._adoption.lay_adoption``). An ordinary user's tree in the store (a
    snapshot of a turn that had one alive) is no mount he can pass: its forks open as
    they would without warm sandboxes."""
    held = snapshot.held_stack
    if len(held) > 1 or len(snapshot.stack) > 1:
        if not adopts_stack(backend) or len(held or snapshot.stack) > MAX_LAYERS:
            return False
        return all(layer.held is not None for layer in held) if held else os.geteuid() == 0
    return snapshot.held_layer is not None or os.geteuid() == 0


def adopt_warm(pool: WarmPool | None, snapshot: TurnSnapshot) -> SandboxSession | None:
    """A warm sandbox of ``pool`` whose workspace now lies on ``snapshot``'s frozen layers,
    or None (no warm sandbox ready, or the adoption failed: that one is closed). The
    caller checked that they can be handed over (``adoptable``)."""
    if pool is None:
        return None
    # Taking one asks the pool to start the next, as a turn's does, once the forks'
    # first calls have had the cores (``ADOPTED_SETTLE``).
    session = pool.take(settle=ADOPTED_SETTLE)
    if session is None:
        return None
    if not isinstance(session, ServerSession) or session.adopt_socket is None:
        session.close()
        return None
    try:
        if session.lay_adoption is not None:
            session.adopt_laid(_lower_of(snapshot), ADOPT_WAIT)
        else:
            with _layers_of(snapshot) as (layer, *below):
                session.adopt(layer, ADOPT_WAIT, below)
    except (SandboxError, OSError) as exc:
        # Never serve a fork from a sandbox whose workspace may be half laid.
        session.close()
        _log.event(_log.WARM, "warm.adopt_failed", {"error": str(exc)[:500]}, _log.WARNING)
        return None
    return session


def _lower_of(snapshot: TurnSnapshot) -> str | tuple[str, ...]:
    """What a host that lays the overlay itself lays it on (root's Docker host): the
    snapshot's stack of layers, top first, or its tree."""
    if snapshot.stack:
        return tuple(str(layer.path) for layer in snapshot.stack)
    return str(snapshot.path)


@contextlib.contextmanager
def _layers_of(snapshot: TurnSnapshot) -> Iterator[tuple[int, ...]]:
    """Descriptors of the snapshot's layers to pass a server, top first: an ordinary
    user's held layers themselves (the host keeps them), or, as root, a clone of each
    tree it staged (of the tree itself where it is no stack), made for that one server
    (closed after)."""
    held = snapshot.held_stack
    if held:
        yield tuple(_held(layer.held) for layer in held)
        return
    paths = [str(layer.path) for layer in snapshot.stack] or [str(snapshot.path)]
    clones: list[int] = []
    try:
        for path in paths:
            clones.append(detached_clone(path))
        yield tuple(clones)
    finally:
        for clone in clones:
            os.close(clone)


def _held(fd: int | None) -> int:
    if fd is None:  # ``adoptable`` passes no stack with a layer no longer held
        raise OSError(errno.EBADF, "a layer of the snapshot is no longer held")
    return fd
