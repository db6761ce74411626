"""Benchmark: starting a turn and calling into it, per backend, against the raw sandbox binary.

For each backend this prints, as medians over a few runs in this same process:

- ``raw``: a one-shot ``bwrap ... /bin/true`` or ``nsjail ... /bin/true`` with
  the very command line the backend builds (the baseline for a turn's start);
- ``start``: ``backend.start(policy)`` until the server is ready;
- ``call after a pause``: one ``/bin/true`` call into the running turn, 20 ms
  after the previous one returned (a model's turn between calls is far longer);
- ``call back to back``: the same, each call right after the last;
- ``spawn``: ``subprocess.run(["/bin/true"])`` on the host, which vforks (the
  baseline for a call);
- ``fork+exec``: ``os.fork`` of this Python process, then exec, then wait.

Run: ``python bench/bench_sandbox.py [--runs N] [backend ...]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from astralvessel.sandbox import Policy, RunRequest
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._nsbackend import NamespaceBackend

TRUE = "/bin/true"
# The pause before each "call after a pause"; a model's turn between two calls is far longer.
PAUSE = 0.02


def _median(action: Callable[[], object], runs: int, pause: float = 0.0) -> float:
    samples = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def _fork_exec() -> None:
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(TRUE, [TRUE])  # noqa: S606 - the baseline itself
        finally:
            os._exit(127)
    os.waitpid(pid, 0)


def bench(name: str, runs: int) -> None:
    """Measure one backend and print its figures and ratios."""
    backend = get_backend(name)
    policy = Policy()
    assert isinstance(backend, NamespaceBackend)
    facts, binary = backend._discover()
    assert binary is not None
    raw_argv = backend._argv(binary, policy, facts, [TRUE], None)

    def raw() -> None:
        subprocess.run(raw_argv, check=True, stdin=subprocess.DEVNULL)

    def start() -> None:
        backend.start(policy).close()

    spawn = _median(lambda: subprocess.run([TRUE], check=True), runs * 3)
    fork_exec = _median(_fork_exec, runs * 3)
    raw_time = _median(raw, runs)
    start_time = _median(start, runs)
    session = backend.start(policy)
    try:
        request = RunRequest(argv=(TRUE,), timeout=10, output_chars=100)
        session.run(request)
        paused = _median(lambda: session.run(request), runs * 5, pause=PAUSE)
        back_to_back = _median(lambda: session.run(request), runs * 5)
    finally:
        session.close()
    print(f"{name} ({binary.describe()})")
    print(f"  raw one-shot sandbox    {raw_time * 1000:8.2f} ms")
    print(
        f"  turn start (+close)     {start_time * 1000:8.2f} ms   {start_time / raw_time:5.1f}x raw"
    )
    print(f"  spawn (vfork+exec)      {spawn * 1000:8.2f} ms")
    print(f"  fork+exec               {fork_exec * 1000:8.2f} ms")
    for label, figure in (("call after a pause", paused), ("call back to back", back_to_back)):
        print(
            f"  {label:<22}  {figure * 1000:8.2f} ms   {figure / raw_time:5.2f}x raw, "
            f"{figure / spawn:5.1f}x spawn, {figure / fork_exec:5.2f}x fork+exec"
        )


def main() -> None:
    """Parse arguments and run every requested backend."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("backends", nargs="*", default=["bubblewrap", "nsjail"])
    args = parser.parse_args()
    for name in args.backends:
        bench(name, args.runs)


if __name__ == "__main__":
    main()
