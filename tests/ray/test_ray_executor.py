"""RayExecutor on a real two-node Ray cluster of this machine, with bubblewrap on each node."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from astralvessel import (
    Agent,
    BackendUnavailableError,
    Executor,
    Registry,
    ToolResult,
    UsageError,
)
from astralvessel._ground._ledger import read_ledger
from astralvessel.ray import RayExecutor
from astralvessel.ray._host import TurnHost
from astralvessel.sandbox import Bubblewrap
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._session import ServerSession
from astralvessel.testing import FakeSandbox

from ..conftest import MakeAgent
from .conftest import SETTLE, Node, wait_for_resource

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
    """A file left in the outbox on the node is a file on this host, kept after the turn while
    a result names it, and removed with the last of them."""
    with pinned(registry, cluster, "node_b").turn() as turn:
        result = turn.call("report", {})
        assert not result.is_error, result.text
    (report,) = result.files
    assert report.name == "report.txt"
    assert Path(report.path).read_text() == "findings\n"
    folder = report.path.parent
    del result, report
    gc.collect()
    assert not folder.exists()


def test_outbox_dir_keeps_the_files_and_nodes_keep_nothing(
    registry: Registry, cluster: dict[str, object], tmp_path: Path, ray_module: object
) -> None:
    """With ``outbox_dir`` the host keeps a turn's files; its node keeps no folder of it."""
    on_node = ray_module.remote(resources={"node_b": 1})(tempfile.gettempdir)  # type: ignore[attr-defined]
    node_tmp = Path(ray_module.get(on_node.remote()))  # type: ignore[attr-defined]
    assert node_tmp == Path(str(cluster["node_tmp"]))  # the cluster's own: no other run's
    before = set(node_tmp.glob("astralvessel-ray-turn-*"))
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
    assert set(node_tmp.glob("astralvessel-ray-turn-*")) <= before


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


@pytest.mark.slow
def test_a_node_lost_mid_turn_gives_an_error_result(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """Killing the node under a running call ends that call with an error result, not a hang."""
    doomed = Node(
        "node_doomed",
        head=False,
        address=str(cluster["address"]),
        temp_dir=str(cluster["temp_dir"]),
        node_tmp=str(cluster["node_tmp"]),
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


# -- async on any event loop -------------------------------------------------------------


def test_trio_awaits_calls_on_a_ray_node(registry: Registry, cluster: dict[str, object]) -> None:
    """Under trio, ``async with`` a Ray turn and concurrent ``acall``s answer from one node."""
    results: list[ToolResult] = []

    async def main() -> None:
        async with pinned(registry, cluster, "node_b").turn() as turn:

            async def one(n: int) -> None:
                results.append(await turn.acall("hello", {"name": str(n)}))

            async with trio.open_nursery() as nursery:
                for n in range(3):
                    nursery.start_soon(one, n)

    trio.run(main)
    assert sorted(r.text.strip() for r in results) == [f"hello {n}" for n in range(3)]
    assert len({r.metadata["node"] for r in results}) == 1


# -- warm turns --------------------------------------------------------------------------


def sandbox_pid(ray_module: Any, actor: Any) -> int:
    """The host pid of the bwrap process holding the sandbox of a turn's actor (all nodes are here)."""

    def pid_of(host: TurnHost) -> int:
        turn = host._turn
        assert turn is not None
        session = turn._session
        assert isinstance(session, ServerSession)
        assert isinstance(session.channel, PipeChannel)
        return session.channel.process.pid

    return int(ray_module.get(actor.__ray_call__.remote(pid_of), timeout=SETTLE))


def actor_id(actor: object) -> str:
    """A Ray actor's id, to compare handles."""
    return str(actor._actor_id.hex())  # type: ignore[attr-defined]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie of a dead parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def settle(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    deadline = time.monotonic() + SETTLE
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.2)


def dead(ray_module: Any, actor: Any) -> bool:
    """Whether a turn's actor is gone: a call to it fails as a dead actor's."""
    try:
        ray_module.get(actor.node_id.remote(), timeout=SETTLE)
    except ray_module.exceptions.RayActorError:
        return True
    return False


def node_of(ray_module: object, resource: str) -> str:
    """The id of the alive node offering ``resource``."""
    (node,) = [
        n["NodeID"]
        for n in ray_module.nodes()  # type: ignore[attr-defined]
        if n["Alive"] and resource in n["Resources"]
    ]
    return str(node)


def test_warm_turns_start_from_the_pool(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """A turn takes an actor whose sandbox the node had started, and that sandbox ends with it."""
    executor = RayExecutor(
        registry,
        sandbox="bubblewrap",
        address=str(cluster["address"]),
        actor_options={"resources": {"node_b": 1}},
        warm=2,
    )
    try:
        assert executor.wait_warm(SETTLE)
        assert executor._warm is not None
        waiting = executor._warm.waiting
        assert {w.node for w in waiting} == {node_of(ray_module, "node_b")}
        assert len(waiting) == 2
        started = {actor_id(w.actor): sandbox_pid(ray_module, w.actor) for w in waiting}
        with executor.turn() as turn:
            result = turn.call("hello", {"name": "warm"})
            assert not result.is_error, result.text
            assert result.text.strip() == "hello warm"
            taken = actor_id(turn._actor)
            assert taken in started
            assert sandbox_pid(ray_module, turn._actor) == started[taken]
        settle(lambda: gone(started[taken]), "the taken turn's sandbox to end with the turn")
        assert executor.wait_warm(SETTLE)
        refilled = {actor_id(w.actor) for w in executor._warm.waiting}
        assert len(refilled) == 2
        assert taken not in refilled
    finally:
        executor.close()


@pytest.mark.slow
def test_a_warm_sandbox_that_died_while_waiting_is_replaced(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """A waiting turn whose sandbox was killed starts a fresh one before its first call."""
    executor = RayExecutor(
        registry,
        sandbox="bubblewrap",
        address=str(cluster["address"]),
        actor_options={"resources": {"node_b": 1}},
        warm=1,
    )
    try:
        assert executor.wait_warm(SETTLE)
        assert executor._warm is not None
        (waiting,) = executor._warm.waiting
        killed = sandbox_pid(ray_module, waiting.actor)
        os.killpg(killed, signal.SIGKILL)
        settle(lambda: gone(killed), "the killed warm sandbox to end")

        def noticed(host: TurnHost) -> bool:
            return host._waited is not None and not host._waited.alive()

        settle(
            lambda: bool(ray_module.get(waiting.actor.__ray_call__.remote(noticed))),  # type: ignore[attr-defined]
            "the waiting turn to notice its sandbox died",
        )
        with executor.turn() as turn:
            result = turn.call("hello", {"name": "again"})
            assert not result.is_error, result.text
            assert actor_id(turn._actor) == actor_id(waiting.actor)
            assert sandbox_pid(ray_module, turn._actor) != killed
    finally:
        executor.close()


@pytest.mark.slow
def test_close_releases_every_warm_sandbox_on_every_node(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """``close`` ends the waiting turns of both nodes: their sandboxes and their actors."""
    executor = RayExecutor(registry, sandbox="bubblewrap", address=str(cluster["address"]), warm=1)
    assert executor.wait_warm(SETTLE)
    assert executor._warm is not None
    waiting = executor._warm.waiting
    assert {w.node for w in waiting} == {
        node_of(ray_module, "node_head"),
        node_of(ray_module, "node_b"),
    }
    pids = [sandbox_pid(ray_module, w.actor) for w in waiting]
    assert not any(gone(pid) for pid in pids)
    executor.close()
    settle(lambda: all(gone(pid) for pid in pids), "every warm sandbox to end")
    # Ray kills an actor asynchronously: a call sent at once may still be answered.
    settle(lambda: all(dead(ray_module, w.actor) for w in waiting), "every warm actor to die")
    with executor.turn() as turn:  # after close, turns start cold
        assert not turn.call("hello", {"name": "cold"}).is_error


@pytest.mark.slow
def test_an_executor_collected_without_close_releases_its_warm_turns(
    registry: Registry, cluster: dict[str, object]
) -> None:
    """Dropping the last reference to a warm RayExecutor ends its waiting turns."""
    executor = RayExecutor(
        registry,
        sandbox="bubblewrap",
        address=str(cluster["address"]),
        actor_options={"resources": {"node_b": 1}},
        warm=1,
    )
    pool = executor._warm
    assert pool is not None
    assert len(pool.waiting) == 1
    del executor
    gc.collect()
    assert pool.waiting == []


@pytest.mark.slow
def test_a_node_lost_with_warm_turns_is_skipped(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """Warm turns of a node that left are not handed out; turns go on elsewhere, close ends."""
    doomed = Node(
        "node_doomed",
        head=False,
        address=str(cluster["address"]),
        temp_dir=str(cluster["temp_dir"]),
        node_tmp=str(cluster["node_tmp"]),
    )
    try:
        wait_for_resource(ray_module, "node_doomed")
        lost = node_of(ray_module, "node_doomed")
        executor = RayExecutor(
            registry, sandbox="bubblewrap", address=str(cluster["address"]), warm=1
        )
        assert executor.wait_warm(SETTLE)
        assert executor._warm is not None
        assert lost in {w.node for w in executor._warm.waiting}
        doomed.kill()
        wait_for_resource(ray_module, "node_doomed", present=False)
        time.sleep(1.0)  # past the pool's trust in its list of alive nodes
        for n in range(3):
            with executor.turn() as turn:
                result = turn.call("hello", {"name": str(n)})
                assert not result.is_error, result.text
                assert result.metadata["node"] != lost
        assert lost not in {w.node for w in executor._warm.waiting}
        executor.close()
    finally:
        doomed.kill()
        wait_for_resource(ray_module, "node_doomed", present=False)


def test_warm_needs_a_node_that_can_hold_the_turns(
    registry: Registry, cluster: dict[str, object]
) -> None:
    """``warm`` with resources no node offers is the host's mistake, said when the executor is made."""
    with pytest.raises(UsageError, match="no alive node"):
        RayExecutor(
            registry,
            sandbox="bubblewrap",
            address=str(cluster["address"]),
            actor_options={"resources": {"node_nowhere": 1}},
            warm=1,
        )


def test_a_turn_opens_from_a_snapshot_on_a_node(
    registry: Registry, cluster: dict[str, object]
) -> None:
    """A snapshot taken here reaches a node through the object store and is that turn's files."""
    with Executor(registry, sandbox="bubblewrap") as local, local.turn() as turn:
        turn.write_file("/workspace/notes.txt", "from the host\n")
        snapshot = turn.snapshot()
    executor = pinned(registry, cluster, "node_b")
    with executor.turn(snapshot=snapshot) as first, executor.turn(snapshot=snapshot) as second:
        seen = first.call("read", {"path": "/workspace/notes.txt"})
        again = second.call("read", {"path": "/workspace/notes.txt"})
    assert not seen.is_error, seen.text
    assert "from the host" in seen.text
    assert "from the host" in again.text
    with pytest.raises(UsageError, match="snapshot is a TurnSnapshot"):
        executor.turn(snapshot=b"saved")  # type: ignore[arg-type]


def test_an_agents_folder_squatted_by_another_user_is_never_used(
    registry: Registry, cluster: dict[str, object], ray_module: object
) -> None:
    """Another local user who made the node's folder of agent copies first (theirs, 0755, or
    one anyone may write) gets nothing of the turn's: the node unpacks into a private folder of its own, and the
    turn runs the host's agent."""
    on_node = ray_module.remote(resources={"node_b": 1})(tempfile.gettempdir)  # type: ignore[attr-defined]
    temporary = Path(ray_module.get(on_node.remote()))  # type: ignore[attr-defined]
    shared = temporary / f"astralvessel-agents-{os.geteuid()}"
    # The turns of this module made it already (this user's): the squatter comes first here.
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)  # another user's
    else:
        shared.chmod(0o777)  # an ordinary user cannot make another's: one anyone may write
    try:
        with pinned(registry, cluster, "node_b").turn() as turn:
            result = turn.call("hello", {"name": "river"})
            listed = turn.call("read", {"path": "/agent/hello.py"})
        assert result.text.strip() == "hello river", result.text
        assert "json.load" in listed.text
        assert list(shared.iterdir()) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_ray_turn_writes_a_replayable_ledger_on_the_host_and_logs_its_placement(
    registry: Registry,
    cluster: dict[str, object],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host's ledger holds the node's results and its sandbox's answers, so it replays in
    ``FakeSandbox``; the placement is logged on astralvessel.ray."""
    caplog.set_level(logging.INFO, logger="astralvessel.ray")
    folder = tmp_path / "ledger"  # beside the agent folder the registry fixture made
    folder.mkdir()
    executor = RayExecutor(
        registry, sandbox="bubblewrap", address=str(cluster["address"]), ledger=folder
    )
    with executor, executor.turn() as turn:
        result = turn.call("hello", {"name": "river"})
        read = turn.call("read", {"path": "/agent/hello.py"})
    (path,) = folder.iterdir()
    records = list(read_ledger(path))
    assert [r["event"] for r in records] == ["turn", "call", "call", "close"]
    call = records[1]
    assert (call["tool"], call["text"], call["outcome"]) == ("hello", result.text, "ok")
    assert (call["backend"], call["policy_id"]) == ("bubblewrap", result.policy_id)
    # The node's sandbox answers came back with its results: the ledger replays locally.
    with Executor(registry, sandbox=FakeSandbox.from_ledger(path)).turn() as replaying:
        assert replaying.call("hello", {"name": "river"}).text == result.text
        assert replaying.call("read", {"path": "/agent/hello.py"}).text == read.text
    placed = [r.astralvessel for r in caplog.records if r.name == "astralvessel.ray"]  # type: ignore[attr-defined]
    assert placed == [{"event": "ray.placed", "warm": False}]
