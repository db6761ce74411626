"""The Ray actor that holds one turn on one node: an ordinary Executor and Turn, local there.

It is a plain class; ``_executor`` makes it a Ray actor. Everything the turn
does (its sandbox, its workspace, its calls) happens on the actor's node, with
that node's backend; only call arguments and results cross the network, and
the outbox files of a call come back as bytes beside its result.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..executor import Executor, Turn
from ..registry import Registry
from ..results import ToolResult
from ._ship import unpack_agent, with_agent_at

__all__ = ["TurnHost"]


class TurnHost:
    """One turn on this node. Never raises from ``__init__``: a failure waits for the first call.

    A constructor that raised would surface on the host as a dead actor, which
    the host reads as a lost node; the host's own mistakes (a backend that cannot
    run there, a bad mount) must instead raise as themselves.
    """

    def __init__(self, registry: Registry, options: Mapping[str, Any], agent: bytes | None) -> None:
        import ray

        self.node: str = ray.get_runtime_context().get_node_id()
        # The node's copy of outbox files lives as long as the turn: the host gets their bytes
        # with each result, and an actor is killed, not collected, so nothing else removes it.
        self._outbox = Path(tempfile.mkdtemp(prefix="astralvessel-ray-turn-"))
        self._failure: Exception | None = None
        self._executor: Executor | None = None
        self._turn: Turn | None = None
        try:
            if agent is not None:
                registry = with_agent_at(registry, unpack_agent(agent))
            build = options.get("sandbox")
            if callable(build):
                # A backend is built here, on its node: an instance holds this node's state.
                options = {**options, "sandbox": build()}
            self._executor = Executor(registry, **options, outbox_dir=self._outbox)
            self._turn = self._executor.turn()
        except Exception as exc:
            self._failure = exc

    def node_id(self) -> str:
        """The Ray node this turn runs on."""
        return self.node

    def call(self, name: str, arguments: object) -> tuple[ToolResult, dict[str, bytes]]:
        """Run one call in this node's turn; the result, and its outbox files' contents."""
        if self._failure is not None:
            raise self._failure
        assert self._turn is not None  # noqa: S101 - set whenever there is no failure
        result = self._turn.call(name, arguments)
        files = {f.name: f.path.read_bytes() for f in result.files}
        return attrs.evolve(result, metadata={**result.metadata, "node": self.node}), files

    def close(self) -> None:
        """End the turn and release the executor's sandboxes on this node."""
        if self._turn is not None:
            self._turn.close()
        if self._executor is not None:
            self._executor.close()
        shutil.rmtree(self._outbox, ignore_errors=True)
