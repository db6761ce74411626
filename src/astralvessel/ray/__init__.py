"""Turns on a Ray cluster: the ``Executor`` API with each turn's sandbox on one node.

Needs the ``ray`` extra (``pip install '.[ray]'``)::

    from astralvessel.ray import RayExecutor

    executor = RayExecutor(registry, sandbox="bubblewrap", address="auto")
    with executor.turn() as turn:
        result = turn.call("species", {"habitat": "rivers"})
        result.metadata["node"]          # the Ray node that ran it

``RayExecutor(..., warm=N)`` keeps N turns started ahead on each node.
See ``docs/scaling.md`` for how the agent folder and mounts reach the nodes.
"""

from __future__ import annotations

from ._executor import RayExecutor as RayExecutor
from ._executor import RayTurn as RayTurn

__all__ = ["RayExecutor", "RayTurn"]
