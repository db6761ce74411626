"""The Ray actor that holds one turn on one node: an ordinary Executor and Turn, local there.

It is a plain class; ``_executor`` makes it a Ray actor. Everything the turn
does (its sandbox, its workspace, its calls) happens on the actor's node, with
that node's backend; only call arguments and results cross the network, and
the outbox files of a call come back as bytes beside its result. A warm turn
(``_warm``) is one whose ``start`` ran before any turn took it.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .._executor._settings import ExecutorSettings
from .._executor._snapshot._value import TurnSnapshot
from .._ground._ledger import Ledger
from .._ground._leftovers import make_folder
from ..executor import Executor, Turn
from ..registry import Registry
from ..results import ToolResult
from ..sandbox._base import Sandbox, SandboxSession
from ._ship import unpack_agent, with_agent_at

__all__ = ["NodeSettings", "TurnHost"]


@attrs.frozen(kw_only=True)
class NodeSettings:
    """What a node builds its turn's executor from, all checked on the host first.

    The backend and the mounts' host paths are the node's own: a backend is built
    there (an instance holds its node's state) and each host path is resolved there.
    """

    settings: ExecutorSettings
    sandbox: str | Callable[[], Sandbox] | None
    #: ``{sandbox path: host path[:rw]}``, as text.
    mounts: Mapping[str, str]


class TurnHost:
    """One turn on this node. Never raises from ``__init__``: a failure waits for the first call.

    A constructor that raised would surface on the host as a dead actor, which
    the host reads as a lost node; the host's own mistakes (a backend that cannot
    run there, a bad mount) must instead raise as themselves.
    """

    def __init__(
        self,
        registry: Registry,
        node: NodeSettings,
        agent: bytes | None,
        snapshot: TurnSnapshot | None = None,
        ran_chars: int | None = None,
    ) -> None:
        """``ran_chars``: the host keeps a ledger, whose calls' records need this node's
        sandbox answers (``ran``, for replay), cut as the host's ``max_chars`` cuts."""
        import ray

        self.node: str = ray.get_runtime_context().get_node_id()
        # The node's copy of outbox files lives as long as the turn: the host gets their bytes
        # with each result, and an actor is killed, not collected, so nothing else removes it.
        # Named for this worker process, which Ray kills outright: the next one removes it.
        self._outbox = Path(make_folder("ray-turn"))
        self._failure: Exception | None = None
        self._executor: Executor | None = None
        self._turn: Turn | None = None
        #: The sandbox ``start`` started ahead, until the turn's first call checks it still runs.
        self._waited: SandboxSession | None = None
        self._lock = threading.Lock()
        #: The sandbox's answer to the call running in this thread, from the node's ledger.
        self._ran = threading.local()
        try:
            if agent is not None:
                registry = with_agent_at(registry, unpack_agent(agent))
            build = node.sandbox
            sandbox = build() if callable(build) else build
            # A call's record reaches the callable in the thread that made the call.
            ledger = None if ran_chars is None else Ledger(target=self._keep, max_chars=ran_chars)
            settings = attrs.evolve(
                node.settings, mounts=node.mounts, outbox_dir=self._outbox, ledger=ledger
            )
            self._executor = Executor(registry, sandbox=sandbox, **settings.arguments())
            self._snapshot = snapshot
            self._turn = self._executor.turn(snapshot=snapshot)
        except Exception as exc:
            self._failure = exc

    def node_id(self) -> str:
        """The Ray node this turn runs on."""
        return self.node

    def start(self) -> Exception | None:
        """Start the turn's sandbox now, ahead of any call (a warm turn); the host's error if not.

        The error is returned, not raised: a raise would read as a lost node on the host.
        """
        if self._failure is not None:
            return self._failure
        assert self._turn is not None  # noqa: S101 - set whenever there is no failure
        try:
            self._waited = self._turn.session
        except Exception as exc:
            return exc
        return None

    def _fresh(self) -> Turn:
        """The turn; a warm sandbox that died while it waited is replaced before its first call.

        Nothing ran in it yet, so nothing is lost: the turn starts a sandbox cold, as
        the local pool's ``take`` skips a dead one.
        """
        if self._failure is not None:
            raise self._failure
        with self._lock:
            assert self._executor is not None  # noqa: S101 - set whenever there is no failure
            assert self._turn is not None  # noqa: S101
            waited, self._waited = self._waited, None
            if waited is not None and not waited.alive():
                self._turn.close()
                self._turn = self._executor.turn(snapshot=self._snapshot)
            return self._turn

    def call(
        self, name: str, arguments: object
    ) -> tuple[ToolResult, dict[str, bytes], dict[str, Any] | None]:
        """Run one call in this node's turn; the result, its outbox files' contents, and the
        sandbox's own answer as the ledger records it (None: a host-side call, or no ledger)."""
        self._ran.value = None
        result = self._fresh().call(name, arguments)
        files = {f.name: f.path.read_bytes() for f in result.files}
        result = attrs.evolve(result, metadata={**result.metadata, "node": self.node})
        ran: dict[str, Any] | None = self._ran.value
        return result, files, ran

    def _keep(self, record: dict[str, Any]) -> None:
        """The node's ledger: only a call's sandbox answer is kept, for its reply."""
        if record.get("event") == "call":
            self._ran.value = record.get("ran")

    def close(self) -> None:
        """End the turn and release the executor's sandboxes on this node."""
        if self._turn is not None:
            self._turn.close()
        if self._executor is not None:
            self._executor.close()
        shutil.rmtree(self._outbox, ignore_errors=True)
