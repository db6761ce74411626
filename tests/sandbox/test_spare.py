"""The confining server's spare: the next call's namespaces, prepared ahead of time.

These tests watch the server's process tree on the host (``/proc``): the server
forks the zygote once (on the host it needs no launcher: see ``_zygote``), and
the zygote forks every call's init; a spare is an init with no child yet,
waiting for its request.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox._base import RunOutcome, RunRequest
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._policy import Limits, Policy
from astralvessel.sandbox._session import ServerSession, server_command

NOBODY = 65534
#: The pid of a call's command in its namespace: init is 1 and starts nothing before it (the
#: zygote maps the ids of init's own user namespace, no helper process of init's does).
CALL_PID = 2
# How long to wait for the process tree to reach an expected shape (never a timing assertion).
SETTLE = 10.0


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A host folder standing in for /workspace, reachable by the unprivileged uid."""
    with tempfile.TemporaryDirectory(prefix="vessel-spare-", dir="/tmp") as path:
        os.chmod(path, 0o777)  # noqa: S103 - the unprivileged call writes its marker files here
        yield Path(path)


def start(workspace: Path, *, confine: bool = True) -> ServerSession:
    """Start a server on this interpreter; confined, it runs calls as 65534 in namespaces."""
    channel = PipeChannel.spawn(server_command(sys.executable), name="spare-test")
    return ServerSession.start(
        channel,
        Policy(limits=Limits(processes=64, open_files=256, disk_mb=8, memory_mb=512)),
        backend="spare-test",
        confine=confine,
        drop_uid=NOBODY if confine else None,
        drop_gid=NOBODY if confine else None,
        seccomp=None,
        path_map={"/workspace": str(workspace)},
    )


@pytest.fixture
def session(workspace: Path) -> Iterator[ServerSession]:
    """A running root-confined server."""
    with start(workspace) as started:
        yield started


def processes() -> Iterator[tuple[int, str, int]]:
    """Every process on the host, from ``/proc``: pid, state letter and parent pid."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        yield int(name), fields[0], int(fields[1])


def children() -> dict[int, list[int]]:
    """Map every live process to its children, from ``/proc``."""
    tree: dict[int, list[int]] = {}
    for pid, state, parent in processes():
        if state != "Z":  # a zombie is dead, only not reaped yet
            tree.setdefault(parent, []).append(pid)
    return tree


def is_init(pid: int) -> bool:
    """Whether ``pid`` is pid 1 of a PID namespace of its own (the last ``NSpid`` entry)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return line.split()[-1] == "1"
    return False


def chains(server: int) -> dict[int, list[int]]:
    """Each init (a spare's or a call's) the server's zygote forked, with its descendants."""
    tree = children()
    found: dict[int, list[int]] = {}
    # The server's children: the zygote, and a file worker or relay, which fork no init.
    for zygote in tree.get(server, []):
        # Only an init is pid 1 of its own namespace. The zygote has one other child, for
        # a moment as it starts: the ``posix_spawn`` it warms up with (see ``_zygote``), which
        # looks just like an idle spare to a walk of /proc.
        for init in filter(is_init, tree.get(zygote, [])):
            below: list[int] = []
            todo = list(tree.get(init, []))
            while todo:
                pid = todo.pop()
                below.append(pid)
                todo.extend(tree.get(pid, []))
            found[init] = below
    return found


def zygote_of(server: int) -> int:
    """The server's child that forks the inits (the worker and the relay have no children)."""
    wait_for(lambda: bool(chains(server)), "an init under the zygote")
    tree = children()
    (zygote,) = [child for child in tree.get(server, []) if tree.get(child)]
    return zygote


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail saying ``what`` if it never does."""
    deadline = time.monotonic() + SETTLE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def spare_of(session: ServerSession, used: Collection[int] = ()) -> tuple[int, list[int]]:
    """Wait until the zygote holds exactly one idle init (the spare), none of ``used``; return it.

    A finished call's init is torn down off the call's path, so for a moment
    it is idle too: callers name the inits they know were used.
    """
    server = int(session.ready_info["pid"])
    seen: list[dict[int, list[int]]] = [{}]

    def one_idle_init() -> bool:
        # Judge one snapshot and keep it: a second walk of /proc may see a call's init
        # that is still being torn down.
        seen[0] = {init: below for init, below in chains(server).items() if init not in used}
        return len(seen[0]) == 1 and not next(iter(seen[0].values()))

    wait_for(one_idle_init, "one spare: an init with no command yet")
    ((init, below),) = seen[0].items()
    return init, below


def alive(pid: int) -> bool:
    """Whether ``pid`` still exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def gated(workspace: Path, then: str, tag: str = "call") -> RunRequest:
    """A call that touches ``<tag>.started``, waits for the file ``go``, then runs ``then``."""
    # The server runs on the host here: a script sees the real folder, not /workspace.
    script = (
        f"touch {workspace}/{tag}.started; "
        f"while [ ! -e {workspace}/go ]; do sleep 0.02; done; {then}"
    )
    return RunRequest(argv=["/bin/sh", "-c", script], timeout=30, output_chars=1000)


def run_in_thread(
    session: ServerSession, request: RunRequest
) -> tuple[threading.Thread, list[RunOutcome]]:
    """Start ``session.run(request)`` in a thread; its outcome lands in the returned list."""
    results: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: results.append(session.run(request)))
    thread.start()
    return thread, results


def test_first_call_runs_in_the_spare_prepared_at_hello(
    session: ServerSession, workspace: Path
) -> None:
    """After ready a spare waits; the next call runs in it and a fresh spare replaces it."""
    spare, _ = spare_of(session)
    server = int(session.ready_info["pid"])
    thread, results = run_in_thread(session, gated(workspace, "echo $$; id -u"))
    try:
        wait_for((workspace / "call.started").exists, "the call started")
        assert spare in chains(server)  # the call's own chain is the spare's
    finally:
        # Let the call end even if a check failed, so its thread never outlives the session.
        (workspace / "go").touch()
        thread.join()
    # The command is the first process init starts for it, and runs unprivileged.
    assert results[0].output.split() == [str(CALL_PID), str(NOBODY)]
    assert results[0].exit_code == 0
    # A fresh spare replaces the one the call took (spare_of fails if none comes).
    spare_of(session, used={spare})


def test_each_call_takes_a_new_spare(session: ServerSession) -> None:
    """Back-to-back calls each run in a fresh namespace; a spare is never used twice."""
    seen: list[int] = []
    for _ in range(3):
        spare, _ = spare_of(session, used=seen)
        seen.append(spare)
        outcome = session.run(
            RunRequest(argv=["/bin/sh", "-c", "echo $$"], timeout=10, output_chars=100)
        )
        # The first command of its namespace, so no earlier call ran there.
        assert outcome.output == f"{CALL_PID}\n"
    wait_for(lambda: not any(alive(pid) for pid in seen), "the used spares' chains are gone")


def test_concurrent_calls_each_get_their_own_namespace(
    session: ServerSession, workspace: Path
) -> None:
    """Calls running at once each have their own chain; none shares the spare or another's."""
    server = int(session.ready_info["pid"])
    started = [
        run_in_thread(session, gated(workspace, f"echo {n} $$ $(id -u)", tag=f"call{n}"))
        for n in range(4)
    ]
    try:
        wait_for(
            lambda: len(list(workspace.glob("call*.started"))) == 4 and len(chains(server)) >= 4,
            "four running calls",
        )
    finally:
        (workspace / "go").touch()
        for thread, _ in started:
            thread.join()
    outputs = [results[0].output.split() for _, results in started]
    assert sorted(outputs) == [[str(n), str(CALL_PID), str(NOBODY)] for n in range(4)]
    spare_of(session)


def test_dead_spare_is_replaced_on_demand(session: ServerSession) -> None:
    """A spare that died (killed here) is not used: the call prepares its own and succeeds."""
    spare, below = spare_of(session)
    os.kill(spare, signal.SIGKILL)
    wait_for(lambda: not alive(spare), "the spare's init died")
    outcome = session.run(RunRequest(argv=["/bin/echo", "fine"], timeout=10, output_chars=100))
    assert outcome.output == "fine\n"
    assert outcome.exit_code == 0
    # A fresh spare replaces the one the call took (spare_of fails if none comes).
    spare_of(session, used={spare})
    wait_for(lambda: not any(alive(pid) for pid in below), "the killed spare's chain is gone")


def test_spare_is_killed_at_close(workspace: Path) -> None:
    """Closing the session kills the spare's whole chain."""
    session = start(workspace)
    spare, below = spare_of(session)
    session.close()
    wait_for(lambda: not any(alive(pid) for pid in [spare, *below]), "the spare died with close")


def test_spare_dies_with_its_server(workspace: Path) -> None:
    """If the server is killed outright, its spare goes too (parent-death signals)."""
    with start(workspace) as session:
        spare, below = spare_of(session)
        os.kill(int(session.ready_info["pid"]), signal.SIGKILL)
        wait_for(
            lambda: not any(alive(pid) for pid in [spare, *below]), "the spare died with the server"
        )


def test_spare_never_reaches_the_next_turn(workspace: Path) -> None:
    """A turn's spare is gone once it closes; the next turn's call runs in a chain of its own."""
    with start(workspace) as first:
        old, old_below = spare_of(first)
    with start(workspace) as second:
        server = int(second.ready_info["pid"])
        thread, results = run_in_thread(second, gated(workspace, "echo ok"))
        try:
            wait_for((workspace / "call.started").exists, "the call started")
            pids = {pid for chain, below in chains(server).items() for pid in [chain, *below]}
        finally:
            (workspace / "go").touch()
            thread.join()
    assert results[0].output == "ok\n"
    assert not pids & {old, *old_below}
    wait_for(
        lambda: not any(alive(pid) for pid in [old, *old_below]), "the first turn's spare died"
    )


def test_unconfined_server_keeps_no_spare(workspace: Path) -> None:
    """Without confinement a call is a plain fork and exec: nothing is prepared ahead."""
    with start(workspace, confine=False) as session:
        outcome = session.run(RunRequest(argv=["/bin/echo", "hi"], timeout=10, output_chars=100))
        assert outcome.output == "hi\n"
        assert chains(int(session.ready_info["pid"])) == {}


def zombies_of(parent: int) -> list[int]:
    """The children of ``parent`` that have exited and wait to be reaped."""
    return [pid for pid, state, ppid in processes() if state == "Z" and ppid == parent]


def processes_running(marker: str) -> list[int]:
    """Live host processes whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(name)):
            found.append(int(name))
    return found


def test_call_returns_only_once_its_processes_are_gone(session: ServerSession) -> None:
    """A background process is already gone when the call returns, not merely dying."""
    marker = f"{os.getpid() % 1000 + 400}.{os.urandom(3).hex().translate(str.maketrans('abcdef', '123456'))}"
    for _ in range(3):
        outcome = session.run(
            RunRequest(
                argv=["/bin/sh", "-c", f"sleep {marker} & sleep {marker} & echo started"],
                timeout=10,
                output_chars=100,
            )
        )
        assert outcome.output == "started\n"
        # No grace period: the server answers only after pid 1 has emptied the namespace.
        assert processes_running(marker) == []


def test_timed_out_call_returns_only_once_its_processes_are_gone(session: ServerSession) -> None:
    """A call killed at its timeout has no process left when its outcome arrives."""
    marker = f"{os.getpid() % 1000 + 500}.{os.urandom(3).hex().translate(str.maketrans('abcdef', '123456'))}"
    outcome = session.run(
        RunRequest(
            argv=["/bin/sh", "-c", f"sleep {marker} & sleep {marker}"],
            timeout=0.5,
            output_chars=100,
        )
    )
    assert outcome.timed_out
    assert processes_running(marker) == []


def test_finished_calls_leave_no_zombie(session: ServerSession) -> None:
    """Each finished call's init is reaped as it exits, so none piles up."""
    server = int(session.ready_info["pid"])
    zygote = zygote_of(server)
    for _ in range(5):
        session.run(RunRequest(argv=["/bin/true"], timeout=10, output_chars=100))
    wait_for(lambda: zombies_of(zygote) == [], "every finished call's init reaped")
    assert zombies_of(server) == []


def test_zygote_is_restarted_if_killed(session: ServerSession) -> None:
    """A zygote that died (killed here) is replaced: calls go on, in fresh namespaces."""
    server = int(session.ready_info["pid"])
    zygote = zygote_of(server)
    spare, _ = spare_of(session)
    os.kill(zygote, signal.SIGKILL)
    wait_for(lambda: not alive(zygote), "the zygote died")
    # Its spare dies with it (PDEATHSIG), a moment later: a call that reached the spare
    # before that would fail as any call whose init is killed from outside does.
    wait_for(lambda: not alive(spare), "the zygote's spare died")
    for _ in range(2):
        outcome = session.run(
            RunRequest(argv=["/bin/sh", "-c", "echo $$"], timeout=10, output_chars=100)
        )
        assert outcome.output == f"{CALL_PID}\n"
    assert zygote_of(server) != zygote
