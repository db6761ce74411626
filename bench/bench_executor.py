"""The executor's own overhead per call, as a ratio against running the command directly.

Three numbers, all measured in this run on this machine:

- direct: ``subprocess.run([python3, species.py])`` with the JSON on stdin (the baseline);
- unconfined: the same call through ``Turn.call`` on the Unconfined backend, so the
  difference is the executor and sandbox server alone (argument checks, schema
  validation, the framed protocol, output accounting);
- confined: the same call through ``Turn.call`` in a running bubblewrap turn.

Run: ``python bench/bench_executor.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import astralvessel as av
from astralvessel.sandbox import Sandbox
from astralvessel.sandbox._policy import SANDBOX_PATH

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "field-guide"
SAMPLE = ROOT / "examples" / "sample-data"
ARGUMENTS = '{"habitat": "rivers"}'


def timed(func: Callable[[], object], calls: int) -> float:
    """Median seconds of ``calls`` runs of ``func`` after two warm-up runs."""
    func()
    func()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        func()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# The interpreter the sandbox finds on its PATH, so both sides run the same python3.
PYTHON3 = shutil.which("python3", path=SANDBOX_PATH) or "python3"


def direct() -> None:
    subprocess.run(
        [PYTHON3, str(EXAMPLE / "tools" / "species.py")],
        input=ARGUMENTS.encode(),
        cwd=SAMPLE,
        capture_output=True,
        check=True,
    )


def through(backend: Sandbox, calls: int) -> float:
    executor = av.Executor(
        av.Registry.for_agent(av.Agent.load(EXAMPLE)), sandbox=backend, mounts={"/data": SAMPLE}
    )
    with executor.turn() as turn:

        def call() -> None:
            result = turn.call("species", ARGUMENTS)
            if result.is_error:
                raise SystemExit(f"benchmark call failed: {result.text}")

        return timed(call, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    calls = parser.parse_args().calls
    from astralvessel.sandbox import Bubblewrap, Unconfined

    base = timed(direct, calls)
    unconfined = through(Unconfined(), calls)
    confined = through(Bubblewrap(), calls)
    print(f"executor overhead, median of {calls} calls of the example's species tool")
    for label, seconds in [
        ("direct subprocess.run (baseline)", base),
        ("Turn.call, unconfined", unconfined),
        ("Turn.call, running bubblewrap turn", confined),
    ]:
        print(f"  {label:<36} {seconds * 1000:8.2f} ms  {seconds / base:6.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
