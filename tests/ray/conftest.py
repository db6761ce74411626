"""A real local Ray cluster of two nodes on this machine: a head and a second node.

Each node is a ``ray start --block`` process in its own session, started here
and stopped here by its process group (never ``ray stop``, which would end
every Ray process on the machine). Each node has one CPU, a small object
store, and a custom resource naming it, so a test can place a turn on either.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).parent / "ray")
# Bounds for a node to join or leave the cluster; never a timing assertion.
SETTLE = 180.0
OBJECT_STORE = str(80 * 1024 * 1024)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Node:
    """One ``ray start --block`` process and the resource that names its node."""

    def __init__(
        self, resource: str, *, head: bool, address: str, temp_dir: str, node_tmp: str
    ) -> None:
        self.resource = resource
        argv = [
            RAY,
            "start",
            "--block",
            "--num-cpus=1",
            f"--object-store-memory={OBJECT_STORE}",
            f"--resources={json.dumps({resource: 100})}",
            "--disable-usage-stats",
        ]
        if head:
            host, port = address.split(":")
            argv += [
                "--head",
                f"--node-ip-address={host}",
                f"--port={port}",
                "--include-dashboard=false",
                f"--temp-dir={temp_dir}",
            ]
        else:
            argv += [f"--address={address}", "--node-ip-address=127.0.0.1"]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            # The node's own TMPDIR: its turns' folders are this cluster's alone, so a test
            # that looks for what a node left is not misled by another Ray run on the host
            # (CI runs two Pythons' suites at once, each with its own cluster).
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": node_tmp},
        )

    def kill(self) -> None:
        """End this node at once: every process of its group (raylet, workers, sandboxes)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=SETTLE)


def wait_for_resource(ray_module: object, resource: str, present: bool = True) -> None:
    """Wait (bounded) until the cluster does (or no longer does) offer ``resource``."""
    deadline = time.monotonic() + SETTLE
    while (resource in ray_module.cluster_resources()) != present:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"the node offering {resource} did not settle"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def ray_module() -> object:
    """Ray itself; the test dependencies install it on every Python we support."""
    import ray as module

    return module


# Module scope: the cluster is gone before the rest of the suite runs beside it.
@pytest.fixture(scope="module")
def cluster(ray_module: object) -> Iterator[dict[str, object]]:
    """A head node (resource ``node_head``) and a second node (``node_b``), joined by this test."""
    # Without auth, whatever the machine holds: once anything ran a local ray.init() here,
    # ~/.ray/auth_token exists, `ray start` then turns token auth on, and `ray status` and
    # the driver (which do not) are refused (InvalidAuthToken) until the fixture gives up.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        yield from _cluster(ray_module)


def _cluster(ray_module: object) -> Iterator[dict[str, object]]:
    address = f"127.0.0.1:{_free_port()}"
    temp_dir = tempfile.mkdtemp(prefix="rayh-")  # a short prefix: Ray nests socket paths in it
    node_tmp = tempfile.mkdtemp(prefix="rayt-")  # short too: sandboxes' sockets go in it
    nodes = [Node("node_head", head=True, address=address, temp_dir=temp_dir, node_tmp=node_tmp)]
    try:
        deadline = time.monotonic() + SETTLE
        while True:
            done = subprocess.run(
                [RAY, "status", f"--address={address}"], capture_output=True, check=False
            )
            if done.returncode == 0:
                break
            assert nodes[0].process.poll() is None, "the Ray head node exited"
            assert time.monotonic() < deadline, done.stderr.decode()[-2000:]
            time.sleep(0.5)
        nodes.append(
            Node("node_b", head=False, address=address, temp_dir=temp_dir, node_tmp=node_tmp)
        )
        # The driver joins as the nodes did, on 127.0.0.1: where the host's first address is
        # another (a VM's eth0), Ray looks for a node of that address and finds none.
        ray_module.init(  # type: ignore[attr-defined]
            address=address,
            logging_level="WARNING",
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
        wait_for_resource(ray_module, "node_b")
        yield {"address": address, "temp_dir": temp_dir, "node_tmp": node_tmp, "nodes": nodes}
    finally:
        ray_module.shutdown()  # type: ignore[attr-defined]
        for node in reversed(nodes):
            node.kill()
        shutil.rmtree(node_tmp, ignore_errors=True)
