"""How much of the engine host processes ask for at once, and which failed requests are repeated.

Why a bound. The requests that make the engine run ``runc`` (create, start,
remove, exec) are the fragile ones under load: on Docker 20.10 with runc 1.1
on cgroup v1, 128 container starts sent at once once left a ``runc create``
and its ``runc init`` waiting on each other, and the engine then hung for
every user of the machine (runc and containerd issue trackers hold many such
hangs, all under many concurrent creates). The engine serialises much of a
start anyway, so requests beyond a handful only queue inside it, where a stuck
one holds all the others. Here they queue in the host process instead: a
bound per engine address and setting, shared by every ``Docker`` backend of
the process, around exactly those requests, and by default also shared with
every other host process of this user driving the same engine (lock files,
see ``_slots``; ``engine_scope='process'`` keeps it per process). Reads
(inspect, logs, version) do not run ``runc`` and get a wider bound of their
own (``READ_FACTOR`` times as many), so that 128 turns closing at once open no
more connections than the SDK's pool keeps; the streams of running turns, and
``wait``, which lasts as long as its container, are not counted at all.

An exec is different: the engine answers ``exec_start`` as soon as the stream
is open, before ``runc exec`` has run, so the bound around the request would
let the next one in while the engine still starts this one. ``docker-exec``
therefore holds a slot itself (``GatedApi.runc_slot``) from the request until
the exec's first byte says it runs, and sends both requests ungated.

Which failures are repeated is a table (``RETRIES``): only answers the engine
gives for conditions that pass and for requests that can be repeated without
doing the thing twice. A removal is repeated on 409 (another removal is under
way) and 500 (the kill or the layer cleanup was busy); a start is never
repeated here, since a failed start leaves a container the caller must remove
first (``Engine.start_container`` does that, then starts a new one). A request
the engine did not answer (refused connection, timeout) is never repeated: an
engine that stopped answering is not helped by more requests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import UsageError
from .._etc import runtime_dir
from ._slots import Bound, Slot, slot_folder

__all__ = [
    "CONCURRENCY_ENV",
    "DEFAULT_CONCURRENCY",
    "GATED",
    "READS",
    "RETRIES",
    "SCOPES",
    "SCOPE_ENV",
    "GatedApi",
    "Gates",
    "gate_for",
    "resolve_concurrency",
    "resolve_scope",
    "retry_delay",
    "status_of",
]

#: Engine requests that run ``runc`` at once per engine and setting (see ``SCOPES``).
DEFAULT_CONCURRENCY = 8
#: Sets the bound where ``Docker(engine_concurrency=...)`` does not.
CONCURRENCY_ENV = "ASTRALVESSEL_DOCKER_CONCURRENCY"
_MAX_CONCURRENCY = 256
#: Sets the bound's scope where ``Docker(engine_scope=...)`` does not.
SCOPE_ENV = "ASTRALVESSEL_DOCKER_SCOPE"
#: Who shares one bound -> whether it is kept in lock files (else in the process alone).
SCOPES: Mapping[str, bool] = {"machine": True, "process": False}
#: Reads at once per request that runs ``runc``: reads are cheap, but each holds a connection.
READ_FACTOR = 4
#: Connections kept beyond both bounds, for the requests counted by neither (ping, attach).
POOL_SLACK = 4

#: The SDK methods that make the engine run ``runc`` (or change what it runs): counted.
GATED = frozenset(
    {"create_container", "start", "remove_container", "kill", "exec_create", "exec_start"}
)
#: The SDK methods that only read the engine's state: counted by the wider read bound.
READS = frozenset(
    {"inspect_container", "exec_inspect", "inspect_image", "containers", "logs", "info", "version"}
)

#: (method, HTTP status the engine answered) -> pauses before each repeat, in seconds.
RETRIES: Mapping[tuple[str, int], tuple[float, ...]] = {
    ("remove_container", 409): (0.2, 0.5, 1.0, 2.0),
    ("remove_container", 500): (0.2, 0.5, 1.0, 2.0),
}


class Gates:
    """The two bounds of one engine and setting: requests that run ``runc``, and reads.

    ``folder`` holds the ``runc`` bound's lock files when host processes share
    it (``None``: this process alone). Reads are bounded per process: they run
    no ``runc``, and their bound only keeps the connection pool enough.
    """

    def __init__(self, size: int, folder: str | Callable[[], str] | None = None) -> None:
        self.runc = Bound(size, folder)
        self.reads = threading.BoundedSemaphore(size * READ_FACTOR)
        #: Connections the SDK should keep: one per request both bounds let through, and slack.
        self.pool_size = size * (1 + READ_FACTOR) + POOL_SLACK

    def for_method(self, name: str) -> Bound | threading.BoundedSemaphore | None:
        """The bound ``name`` is counted by, or ``None``."""
        if name in GATED:
            return self.runc
        if name in READS:
            return self.reads
        return None


_gates: dict[tuple[str, int, str], Gates] = {}
_gates_lock = threading.Lock()


def resolve_concurrency(value: int | None) -> int:
    """The bound from the argument, else ``$ASTRALVESSEL_DOCKER_CONCURRENCY``, else the default."""
    raw: object = value
    source = "engine_concurrency"
    if value is None:
        raw = os.environ.get(CONCURRENCY_ENV, "").strip() or DEFAULT_CONCURRENCY
        source = f"${CONCURRENCY_ENV}"
    count = 0
    if isinstance(raw, int | str) and not isinstance(raw, bool):
        with contextlib.suppress(ValueError):
            count = int(raw)
    if not 1 <= count <= _MAX_CONCURRENCY:
        raise UsageError(
            f"{source} is how many container starts, removals and execs are sent to the "
            f"engine at once: a whole number from 1 to {_MAX_CONCURRENCY}, "
            f"not {raw!r}"
        )
    return count


def resolve_scope(value: str | None) -> str:
    """The scope from the argument, else ``$ASTRALVESSEL_DOCKER_SCOPE``, else ``machine``."""
    source, raw = "engine_scope", value
    if value is None:
        source, raw = f"${SCOPE_ENV}", os.environ.get(SCOPE_ENV, "").strip() or "machine"
    if not isinstance(raw, str) or raw not in SCOPES:
        raise UsageError(
            f"{source} says who shares the engine bound: 'machine' (every host process of "
            f"this user on this engine) or 'process' (each host process its own), not {raw!r}"
        )
    return raw


def _engine_folder(address: str) -> str:
    return slot_folder(runtime_dir(os.geteuid()), address)


def gate_for(address: str, size: int, scope: str = "process") -> Gates:
    """The process's one set of bounds for ``address`` at ``size`` and ``scope``.

    A ``machine`` scope makes (or checks) this user's slot folder for the
    engine when the first request takes a place, raising
    ``BackendUnavailableError`` there if it is not safe to use.
    """
    with _gates_lock:
        gates = _gates.get((address, size, scope))
        if gates is None:
            locate = functools.partial(_engine_folder, address) if SCOPES[scope] else None
            gates = _gates[(address, size, scope)] = Gates(size, locate)
        return gates


def status_of(exc: BaseException) -> int | None:
    """The HTTP status the engine answered with, or ``None`` if it did not answer."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def retry_delay(method: str, status: int | None, attempt: int) -> float | None:
    """The pause before repeating ``method`` after its ``attempt``-th failure, or ``None``."""
    pauses = RETRIES.get((method, status)) if status is not None else None
    if pauses is None or attempt > len(pauses):
        return None
    return pauses[attempt - 1]


class GatedApi:
    """The SDK's low-level client, with ``GATED`` requests and ``READS`` counted by their bounds.

    Any other attribute is the client's own. A counted request that fails as
    ``RETRIES`` allows is repeated after its pause, outside the bound.
    """

    def __init__(self, api: Any, gates: Gates) -> None:
        self._api = api
        self._gates = gates

    @property
    def ungated(self) -> Any:
        """The SDK's client itself, for requests whose caller holds a ``runc_slot``."""
        return self._api

    def runc_slot(self, deadline: float | None = None) -> Slot:
        """Hold one ``runc`` place until ``Slot.release``; ``TimeoutError`` at ``deadline``."""
        return self._gates.runc.acquire(deadline)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._api, name)
        gate = self._gates.for_method(name)
        if gate is None:
            return value
        return self._counted(name, value, gate)

    def _counted(
        self, name: str, method: Callable[..., Any], gate: Bound | threading.BoundedSemaphore
    ) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            attempt = 0
            while True:
                attempt += 1
                try:
                    with gate:
                        return method(*args, **kwargs)
                except Exception as exc:
                    pause = retry_delay(name, status_of(exc), attempt)
                    if pause is None:
                        raise
                time.sleep(pause)

        return counted
