"""Benchmark: turns on a Ray node against the same turns in this process, measured in one run.

The Ray figures of issue 17, on bubblewrap, each against its local twin:

- ``turn start + call``: opening a turn and its first ``/bin/true`` call,
  placed cold on the other node (a new actor: a Ray worker process, then the
  sandbox), against a cold local ``Executor`` turn doing the same.
- ``warm turn start + call``: the same with ``RayExecutor(warm=2)``, taking a
  turn whose actor and sandbox were started ahead, against a local
  ``Executor(warm=1)`` turn.
- ``call``: one call into a running turn on the other node, against one into
  a running local turn: what the Ray round trip adds.

Issue 17 sets no target for these; they say what placing a turn on a node
costs. Without ``--address`` the bench starts a two-node cluster on this
machine (``ray start --head`` and a second ``ray start``, one CPU each),
stopped by process group at the end; a turn then goes to the second node.

Run: ``python bench/bench_ray.py [--runs N] [--address HOST:PORT]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from astralvessel import Executor, Registry, ToolSpec
from astralvessel.ray import RayExecutor

TRUE = "/bin/true"
PAUSE = 0.02
SETTLE = 120.0
RAY = str(Path(sys.executable).parent / "ray")
REGISTRY = Registry([ToolSpec.command_tool("true", "Do nothing.", [TRUE])])


def median_ms(action: Callable[[], object], runs: int, pause: float = 0.0) -> float:
    samples = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        began = time.perf_counter()
        action()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


@contextlib.contextmanager
def local_cluster() -> Iterator[str]:
    """A head node and a second node offering the resource ``bench_remote``; their address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    temp_dir = tempfile.mkdtemp(prefix="raybench-")
    common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
    head = [*common, "--head", "--node-ip-address=127.0.0.1", f"--port={address.split(':')[1]}"]
    head += ["--include-dashboard=false", f"--temp-dir={temp_dir}"]
    other = [*common, f"--address={address}", "--node-ip-address=127.0.0.1"]
    other.append(f"--resources={json.dumps({'bench_remote': 100})}")
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        nodes.append(start_node(head))
        deadline = time.monotonic() + SETTLE
        status = [RAY, "status", f"--address={address}"]
        while subprocess.run(status, capture_output=True, check=False).returncode:
            if time.monotonic() > deadline:
                raise SystemExit("the Ray head node did not start")
            time.sleep(0.5)
        nodes.append(start_node(other))
        yield address
    finally:
        for node in reversed(nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def start_node(arguments: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [RAY, "start", *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )


def turn_and_call(executor: Executor | RayExecutor) -> None:
    with executor.turn() as turn:
        result = turn.call("true")
        assert not result.is_error, result.text


def row(figure: str, value: float, baseline: float) -> None:
    ratio = value / baseline
    print(f"  {figure:<26} {value:>9.1f} ms {'local ' + f'{baseline:.1f} ms':>18} {ratio:>7.1f}x")


def bench(ray: Any, runs: int, remote: dict[str, Any]) -> None:
    deadline = time.monotonic() + SETTLE
    while not any("bench_remote" in n["Resources"] for n in ray.nodes() if n["Alive"]):
        if time.monotonic() > deadline:
            raise SystemExit("no node offers the resource bench_remote")
        time.sleep(0.5)
    local = Executor(REGISTRY, sandbox="bubblewrap")
    cold = RayExecutor(REGISTRY, sandbox="bubblewrap", actor_options=remote)
    turn_and_call(local)
    turn_and_call(cold)
    print(f"  {'figure':<26} {'on Ray':>12} {'baseline':>18} {'ratio':>8}")
    row(
        "turn start + call",
        median_ms(lambda: turn_and_call(cold), runs),
        median_ms(lambda: turn_and_call(local), runs),
    )

    with (
        Executor(REGISTRY, sandbox="bubblewrap", warm=1) as warm_local,
        RayExecutor(REGISTRY, sandbox="bubblewrap", actor_options=remote, warm=2) as warm_ray,
    ):

        def warm_turn(executor: Executor | RayExecutor) -> float:
            assert executor.wait_warm(SETTLE)
            began = time.perf_counter()
            turn_and_call(executor)
            return (time.perf_counter() - began) * 1000

        ray_ms = statistics.median(warm_turn(warm_ray) for _ in range(runs))
        local_ms = statistics.median(warm_turn(warm_local) for _ in range(runs))
    row("warm turn start + call", ray_ms, local_ms)

    with local.turn() as here, cold.turn() as there:
        here.call("true")
        there.call("true")
        ray_ms = median_ms(lambda: there.call("true"), runs * 5, pause=PAUSE)
        local_ms = median_ms(lambda: here.call("true"), runs * 5, pause=PAUSE)
    row("call", ray_ms, local_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="samples per median")
    parser.add_argument(
        "--address",
        help="a running cluster; its turns go to nodes offering the resource bench_remote",
    )
    args, _ = parser.parse_known_args()
    import ray

    cluster = contextlib.nullcontext(args.address) if args.address else local_cluster()
    with cluster as address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        try:
            print(
                f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; medians of {args.runs} "
                "runs; bubblewrap on every node\nray"
            )
            bench(ray, args.runs, {"resources": {"bench_remote": 1}})
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
