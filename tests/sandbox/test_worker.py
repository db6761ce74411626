"""The sandbox server's file worker: what starting one costs when it cannot start."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import astralvessel

# Run in a process of its own: with RLIMIT_NPROC at 0, a user that is not root cannot fork,
# so start_worker meets a real EAGAIN from fork(2). Root is not bound by it: the process
# becomes nobody first (after its imports, which may live where nobody cannot read).
_FORK_FAILS = textwrap.dedent(
    """
    import os, resource
    from astralvessel.sandbox.server import _worker

    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        try:
            _worker.start_worker(drop_uid=None, drop_gid=None, context={})
        except BlockingIOError:
            pass
        else:
            raise SystemExit("the worker started although fork(2) is bounded at 0 processes")
    after = sorted(os.listdir("/proc/self/fd"))
    print(len(before), len(after))
    """
)


def test_a_failed_fork_leaves_no_descriptor_open() -> None:
    """start_worker closes both pipes' four ends when fork(2) fails, however often it is tried."""
    src = str(Path(astralvessel.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {src!r})\n" + _FORK_FAILS],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert after == before, f"{int(after) - int(before)} descriptors leaked"
