"""Which nodes keep warm turns: a pure choice over ``ray.nodes()`` entries, no cluster needed."""

from __future__ import annotations

import pytest
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from astralvessel import Registry, ToolSpec, UsageError
from astralvessel.ray import RayExecutor
from astralvessel.ray._warm import pool_nodes

# Node ids are 28 bytes in hex, as Ray checks when a strategy names one.
A, B, C = "a1" * 28, "b2" * 28, "c3" * 28
NODES = [
    {"NodeID": A, "Alive": True, "Resources": {"CPU": 4.0, "sandbox": 1.0}},
    {"NodeID": B, "Alive": True, "Resources": {"CPU": 1.0, "GPU": 1.0}},
    {"NodeID": C, "Alive": False, "Resources": {"CPU": 8.0, "sandbox": 1.0}},
]


def test_every_alive_node_by_default() -> None:
    """Without resources asked for, every alive node keeps warm turns; a dead one none."""
    assert pool_nodes(NODES, {"scheduling_strategy": "SPREAD"}) == [A, B]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"resources": {"sandbox": 1}}, [A]),
        ({"num_gpus": 1}, [B]),
        ({"num_cpus": 2}, [A]),
        ({"resources": {"sandbox": 1}, "num_gpus": 1}, []),
    ],
)
def test_only_nodes_offering_what_turns_ask_for(
    options: dict[str, object], expected: list[str]
) -> None:
    """A node keeps warm turns only if it offers every resource a turn's actor asks for."""
    assert pool_nodes(NODES, options) == expected


def test_a_node_affinity_pins_the_pool() -> None:
    """A node-affinity strategy keeps warm turns on that node alone."""
    strategy = NodeAffinitySchedulingStrategy(node_id=B, soft=False)
    assert pool_nodes(NODES, {"scheduling_strategy": strategy}) == [B]


def test_a_placement_group_cannot_keep_warm_turns() -> None:
    """A placement-group strategy is refused with warm turns, naming what to use instead."""
    strategy = PlacementGroupSchedulingStrategy(PlacementGroup.empty())
    with pytest.raises(UsageError, match="resources"):
        pool_nodes(NODES, {"scheduling_strategy": strategy})


@pytest.mark.parametrize("warm", [-1, True, 1.5])
def test_warm_must_be_a_count(warm: object) -> None:
    """``warm`` is a non-negative integer on Ray too, refused before any cluster is joined."""
    registry = Registry([ToolSpec.command_tool("true", "Do nothing.", ["/bin/true"])])
    with pytest.raises(UsageError, match="warm"):
        RayExecutor(registry, sandbox="bubblewrap", warm=warm)
