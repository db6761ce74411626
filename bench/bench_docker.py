"""Benchmark the Docker backend against plain Docker on the same engine.

Prints two ratios, each against a baseline measured in the same run:

- a call into a running turn (``/bin/true`` through the sandbox server) against
  ``docker exec <container> /bin/true`` on a plain running container (the CLI,
  as a user would run it, and the SDK's exec API, which skips the CLI's start-up);
- a turn's start (container up, server ready) against ``docker run --rm IMAGE true``.

Usage: python bench/bench_docker.py [--image IMAGE] [--calls N] [--starts N]
The image defaults to $ASTRALVESSEL_DOCKER_IMAGE or astralvessel-test/base:bookworm
(built offline by .ci/build-images.sh).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

import docker
from astralvessel.sandbox import Policy, RunRequest
from astralvessel.sandbox.docker import Docker


def _median_ms(action: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--image",
        default=os.environ.get("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm"),
    )
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--starts", type=int, default=8)
    args = parser.parse_args()

    client = docker.from_env(version="auto")
    api = client.api
    plain = api.create_container(
        args.image,
        command=["sleep", "3600"],
        host_config=api.create_host_config(network_mode="none"),
    )
    api.start(plain)
    backend = Docker(base_image=args.image, pull=False)
    session = backend.start(Policy())
    try:
        request = RunRequest(argv=["/bin/true"], timeout=30, output_chars=1000)
        session.run(request)  # warm up

        def cli_exec() -> None:
            subprocess.run(["docker", "exec", plain["Id"], "/bin/true"], check=True)

        def sdk_exec() -> None:
            exec_id = api.exec_create(plain["Id"], ["/bin/true"])["Id"]
            api.exec_start(exec_id)

        exec_cli_ms = _median_ms(cli_exec, args.calls)
        exec_sdk_ms = _median_ms(sdk_exec, args.calls)
        call_ms = _median_ms(lambda: session.run(request), args.calls)
    finally:
        session.close()
        api.remove_container(plain, force=True)

    def run_rm() -> None:
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", args.image, "true"], check=True
        )

    def turn_start() -> None:
        backend.start(Policy()).close()

    run_ms = _median_ms(run_rm, args.starts)
    start_ms = _median_ms(turn_start, args.starts)
    engine = client.version().get("Version")
    client.close()

    rows = [
        ("call into a running turn", call_ms, f"median of {args.calls}"),
        (
            "docker exec CLI /bin/true",
            exec_cli_ms,
            f"ratio {exec_cli_ms / call_ms:.1f}x (target >= 10x)",
        ),
        ("docker exec SDK /bin/true", exec_sdk_ms, f"ratio {exec_sdk_ms / call_ms:.1f}x"),
        ("turn start + close", start_ms, f"median of {args.starts}"),
        ("docker run --rm IMAGE true", run_ms, f"turn start is {start_ms / run_ms:.2f}x of this"),
    ]
    print(f"engine {engine}, image {args.image}")
    for name, value, note in rows:
        print(f"{name:<30} {value:8.1f} ms  {note}")


if __name__ == "__main__":
    main()
