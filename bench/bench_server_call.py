"""What a call into a running sandbox server costs, against a bare fork+exec of /bin/true.

Run as root to include the root-confined server (PID namespace, uid drop, rlimits).
Prints milliseconds per call and the ratios to both baselines measured in the same run.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable

from astralvessel.sandbox._base import RunRequest
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._policy import Policy
from astralvessel.sandbox._session import ServerSession, server_command

ROUNDS = 200
TRUE = RunRequest(argv=["/bin/true"], timeout=10, output_chars=1000)


def per_call(action: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Seconds per call of ``action``, after a short warm-up."""
    for _ in range(10):
        action()
    start = time.perf_counter()
    for _ in range(rounds):
        action()
    return (time.perf_counter() - start) / rounds


def bare_fork_exec() -> None:
    """The baseline: fork this Python process and exec /bin/true."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["/bin/true"])  # noqa: S606 - the baseline itself
        finally:
            os._exit(127)
    os.waitpid(pid, 0)


def spawn_exec() -> None:
    """The other baseline: posix_spawn (a vfork and exec, as subprocess does), then wait."""
    os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0)


def server(confine: bool, workspace: str) -> ServerSession:
    """A running server on this interpreter, confining its calls as root if asked."""
    channel = PipeChannel.spawn(server_command(sys.executable), name="bench")
    return ServerSession.start(
        channel,
        Policy(),
        backend="bench",
        confine=confine,
        drop_uid=65534 if confine else None,
        drop_gid=65534 if confine else None,
        seccomp=None,
        path_map={"/workspace": workspace},
    )


def main() -> None:
    """Measure and print each figure with its ratio to the baseline."""
    baseline = per_call(bare_fork_exec)
    spawned = per_call(spawn_exec)
    print(f"bare fork+exec of /bin/true: {baseline * 1000:.2f} ms/call (1.0x)")
    print(f"posix_spawn of /bin/true: {spawned * 1000:.2f} ms/call ({spawned / baseline:.2f}x)")
    modes = [("unconfined server", False)]
    if os.geteuid() == 0:
        modes.append(("root-confined server", True))
    for label, confine in modes:
        with tempfile.TemporaryDirectory(dir="/tmp") as workspace:
            os.chmod(workspace, 0o755)  # noqa: S103 - the unprivileged uid must reach it
            with server(confine, workspace) as session:
                cost = per_call(functools.partial(session.run, TRUE))
        print(
            f"{label} call of /bin/true: {cost * 1000:.2f} ms/call "
            f"({cost / baseline:.2f}x fork+exec, {cost / spawned:.1f}x posix_spawn)"
        )
    if os.geteuid() != 0:
        print("(run as root to measure the root-confined server)")


if __name__ == "__main__":
    main()
