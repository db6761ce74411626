"""A turn that forked keeps its calls' memory: the frozen workspace's pages stay charged to
its memory group, so the host raises that group's bound by them (root, where a turn has a
memory group on bubblewrap and nsjail, and on Docker, whose container's bound the engine
raises).

Without it a turn that forked a nearly full workspace could not rewrite it: the kernel
killed the rewrite (this test, run on the code before the bound was raised).
"""

from __future__ import annotations

import os

import pytest

from astralvessel import Executor, Registry
from astralvessel._executor._snapshot._freeze import freezes_here
from astralvessel.sandbox import Limits, Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a turn has a memory group as root")

#: The workspace's bound and how much of it each of the two fills takes (MiB).
_DISK = 512
_FILL = 400
#: The calls' memory, and what the call after the fork allocates and touches (MiB).
_MEMORY = 128
_ALLOCATE = 70
_TOUCH = f"b = bytearray({_ALLOCATE} << 20); b[::4096] = b'x' * len(b[::4096]); print('allocated')"


def _backend(name: str) -> Sandbox:
    from astralvessel.sandbox import Bubblewrap, Nsjail
    from astralvessel.sandbox.docker import Docker

    if name == "docker":
        # The image .ci/build-images.sh builds, as tests/docker's conftest reads it.
        image = os.environ.get("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")
        return Docker(base_image=image, pull=False)
    return Bubblewrap() if name == "bubblewrap" else Nsjail()


@pytest.mark.parametrize("name", ["bubblewrap", "nsjail", "docker"])
def test_a_turn_that_forked_a_full_workspace_keeps_its_calls_memory(name: str) -> None:
    assert freezes_here(name)
    registry = Registry()
    registry.add_builtin("bash")
    executor = Executor(
        registry,
        sandbox=_backend(name),
        timeout_seconds=60,
        limits=Limits(disk_mb=_DISK, memory_mb=_MEMORY),
    )
    fill = f"head -c {_FILL}M /dev/zero > {{name}} && echo filled"
    with executor.turn() as turn:
        assert turn.exec(["sh", "-c", fill.format(name="first")]).stdout == b"filled\n"
        (fork,) = turn.fork(1)
        with fork:
            mounts = turn.exec(["grep", " /workspace ", "/proc/mounts"]).stdout
            assert b"overlay" in mounts, "the workspace was not frozen in place"
            rewrite = "rm first && " + fill.format(name="second")
            assert turn.exec(["sh", "-c", rewrite]).stdout == b"filled\n"
            touched = turn.exec(["python3", "-c", _TOUCH])
            assert (touched.returncode, touched.stdout) == (0, b"allocated\n"), touched
            assert not touched.stopped_by_limit
            # The fork reads the frozen files, none of the parent's later ones.
            listed = fork.exec(["sh", "-c", "ls; wc -c < first"]).stdout.split()
            assert listed == [b"first", b"outbox", str(_FILL << 20).encode()]
