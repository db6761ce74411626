"""RayExecutor on a real two-node Ray cluster of this machine, with bubblewrap on each node."""

from __future__ import annotations

import asyncio
import concurrent.futures
import tempfile
import time
from pathlib import Path

import pytest

from astralvessel import Agent, BackendUnavailableError, Registry, UsageError
from astralvessel.ray import RayExecutor
from astralvessel.sandbox import Bubblewrap

from ..conftest import MakeAgent
from .conftest import Node, wait_for_resource

VESSEL = """
name = "remote"
scopes = ["tools:read", "tools:files"]

[tools]
builtin = ["read"]
declared = ["tools/hello.toml", "tools/nap.toml", "tools/report.toml"]
"""
HELLO = """
name = "hello"
description = "Say hello from a script shipped in the agent folder."
command = ["python3", "{package}/hello.py"]
"""
NAP = """
name = "nap"
description = "Sleep for a while."
command = ["sleep", "30"]
timeout_seconds = 40
"""
REPORT = """
name = "report"
description = "Leave a report in the outbox."
command = ["/bin/sh", "-c", "echo findings > $VESSEL_OUTBOX/report.txt; echo done"]
"""
SCRIPT = "import json, sys\nprint('hello', json.load(sys.stdin)['name'])\n"


@pytest.fixture
def registry(make_agent: MakeAgent) -> Registry:
    """An agent whose tool runs a script that exists only in the agent folder on the host."""
    folder = make_agent(
        VESSEL,
        {
            "tools/hello.toml": HELLO,
            "tools/nap.toml": NAP,
            "tools/report.toml": REPORT,
            "hello.py": SCRIPT,
        },
    )
    return Registry.for_agent(Agent.load(folder))


def pinned(registry: Registry, cluster: dict[str, object], resource: str) -> RayExecutor:
    """A RayExecutor on bubblewrap whose turns go to the node offering ``resource``."""
    return RayExecutor(
        registry,
        sandbox="bubblewrap",
        address=str(cluster["address"]),
        actor_options={"resources": {resource: 1}},
    )


def test_a_turn_runs_on_one_node_and_says_which(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """Each call's result names the node; the agent folder reached it without a shared disk."""
    nodes = {n["NodeID"] for n in ray_module.nodes() if n["Alive"]}  # type: ignore[attr-defined]
    with pinned(registry, cluster, "node_b").turn() as turn:
        first = turn.call("hello", {"name": "river"})
        second = turn.call("read", {"path": "/agent/hello.py"})
    assert not first.is_error, first.text
    assert first.text.strip() == "hello river"
    assert not second.is_error, second.text
    assert "json.load" in second.text
    assert first.metadata["node"] in nodes
    assert first.metadata["node"] == second.metadata["node"]


def test_turns_spread_over_both_nodes(registry: Registry, cluster: dict[str, object]) -> None:
    """Turns placed on each node run there: two turns, two different nodes."""
    seen = set()
    for resource in ("node_head", "node_b"):
        with pinned(registry, cluster, resource).turn() as turn:
            result = turn.call("hello", {"name": resource})
            assert not result.is_error, result.text
            seen.add(result.metadata["node"])
    assert len(seen) == 2


async def test_async_calls_run_concurrently_in_one_turn(
    registry: Registry, cluster: dict[str, object]
) -> None:
    """``acall`` awaits the node; calls of one turn may be in flight at once."""
    async with pinned(registry, cluster, "node_b").turn() as turn:
        results = await asyncio.gather(*(turn.acall("hello", {"name": str(n)}) for n in range(4)))
    assert sorted(r.text.strip() for r in results) == [f"hello {n}" for n in range(4)]
    assert len({r.metadata["node"] for r in results}) == 1


def test_outbox_files_come_back_to_the_host(registry: Registry, cluster: dict[str, object]) -> None:
    """A file left in the outbox on the node is a file on this host, removed with the turn."""
    with pinned(registry, cluster, "node_b").turn() as turn:
        result = turn.call("report", {})
        assert not result.is_error, result.text
        (report,) = result.files
        assert report.name == "report.txt"
        assert Path(report.path).read_text() == "findings\n"
    assert not Path(report.path).exists()


def test_outbox_dir_keeps_the_files_and_nodes_keep_nothing(
    registry: Registry, cluster: dict[str, object], tmp_path: Path
) -> None:
    """With ``outbox_dir`` the host keeps a turn's files; its node keeps no folder of it."""
    node_folders = Path(tempfile.gettempdir()).glob("astralvessel-ray-turn-*")
    before = set(node_folders)
    executor = RayExecutor(
        registry,
        sandbox="bubblewrap",
        address=str(cluster["address"]),
        actor_options={"resources": {"node_b": 1}},
        outbox_dir=tmp_path / "kept",
    )
    with executor.turn() as turn:
        (report,) = turn.call("report", {}).files
    assert Path(report.path).read_text() == "findings\n"
    assert Path(report.path).is_relative_to(tmp_path / "kept")
    assert set(Path(tempfile.gettempdir()).glob("astralvessel-ray-turn-*")) <= before


def test_model_mistakes_are_results_host_mistakes_raise(
    registry: Registry, cluster: dict[str, object]
) -> None:
    """An unknown tool is an error result; a backend that cannot start on the node raises."""
    with pinned(registry, cluster, "node_b").turn() as turn:
        result = turn.call("no_such_tool", {})
        assert result.is_error
        assert "no_such_tool" in result.text
    broken = RayExecutor(
        registry,
        sandbox=lambda: Bubblewrap("/nonexistent/bwrap"),
        address=str(cluster["address"]),
        actor_options={"resources": {"node_b": 1}},
    )
    with broken.turn() as turn, pytest.raises(BackendUnavailableError):
        turn.call("hello", {"name": "x"})


def test_backend_instances_are_refused(registry: Registry, cluster: dict[str, object]) -> None:
    """A backend instance cannot travel to the nodes; its name or class can."""
    with pytest.raises(UsageError, match="name"):
        RayExecutor(registry, sandbox=Bubblewrap(), address=str(cluster["address"]))  # type: ignore[arg-type]


def test_a_node_lost_mid_turn_gives_an_error_result(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """Killing the node under a running call ends that call with an error result, not a hang."""
    doomed = Node(
        "node_doomed",
        head=False,
        address=str(cluster["address"]),
        temp_dir=str(cluster["temp_dir"]),
    )
    try:
        wait_for_resource(ray_module, "node_doomed")
        with pinned(registry, cluster, "node_doomed").turn() as turn:
            assert not turn.call("hello", {"name": "before"}).is_error
            with concurrent.futures.ThreadPoolExecutor(1) as threads:
                pending = threads.submit(turn.call, "nap", {})
                time.sleep(1.0)  # let the call reach the node (an earlier kill also fails it)
                doomed.kill()
                result = pending.result()
        assert result.is_error
        assert "Ray node" in result.text
        assert "workspace" in result.text
    finally:
        doomed.kill()
        wait_for_resource(ray_module, "node_doomed", present=False)
