"""A call's processes never outlive its server's zygote, whichever way the call took its ids.

A call's init dies with the zygote that forked it (its parent-death signal), and
the kernel then empties init's PID namespace. The kernel clears that signal
whenever a process's ids change, and init changes them after forking: it enters
a user namespace of its own as uid 65534, or (as root where no such namespace can
be made) drops to the uid. Inside bubblewrap, nsjail or Docker the sandbox's own
PID namespace would end a leftover init at close anyway; here the server runs on
the host, as in ``test_spare``, so nothing else would.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel._ground._leftovers import start_time
from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import _session
from astralvessel.sandbox._base import RunOutcome, RunRequest
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._policy import EGRESS_DIR, Limits, Policy, Promise
from astralvessel.sandbox._session import ServerSession, server_command

from .test_spare import NOBODY, alive, chains, processes, wait_for, zygote_of

POLICY = Policy(
    limits=Limits(processes=64, open_files=256, disk_mb=8, memory_mb=512),
    # The probe answer planted below says a call's own user namespace cannot be made.
    relaxed=frozenset({Promise.PROCESS_LIMIT}),
)
#: How the call takes its ids: the probe's step that, planted as failed, picks that way.
PATHS = {"own user namespace": None, "dropped uid": "user_namespace"}


def start(workspace: Path, failed_step: str | None, policy: Policy = POLICY) -> ServerSession:
    """Start a root-confined server on this interpreter; ``failed_step``: plant it as failed."""

    def boot() -> ServerSession:
        channel = PipeChannel.spawn(server_command(sys.executable), name="parent-death-test")
        return ServerSession.start(
            channel,
            policy,
            backend="parent-death-test",
            confine=True,
            drop_uid=NOBODY,
            drop_gid=NOBODY,
            seccomp=None,
            path_map={"/workspace": str(workspace)},
            probe_key="parent-death-test",
        )

    if failed_step is not None:
        # The host hands a turn the probe answer of the last turn started alike: a first
        # turn records the real one, and the next takes it with this step marked failed.
        boot().close()
        ((key, found),) = _session._PROBED.items()
        _session._PROBED[key] = dict(found, **{failed_step: "planted by the test"})
    return boot()


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A host folder standing in for /workspace, reachable by the unprivileged uid."""
    with tempfile.TemporaryDirectory(prefix="vessel-pdeath-", dir="/tmp") as path:
        os.chmod(path, 0o777)  # noqa: S103 - the unprivileged call writes its marker here
        yield Path(path)


@pytest.fixture(params=list(PATHS), ids=list(PATHS))
def session(
    request: pytest.FixtureRequest, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServerSession]:
    """A running root-confined server whose calls take their ids one way or the other."""
    monkeypatch.setattr(_session, "_PROBED", {})
    failed_step = PATHS[request.param]
    with start(workspace, failed_step) as started:
        assert ("user_namespace" in started.ready_info["problems"]) == (failed_step is not None)
        yield started


def running_call(session: ServerSession, workspace: Path) -> tuple[threading.Thread, list[int]]:
    """Start a call that leaves two sleepers and waits; return its thread and its chain's
    processes (init first), once all are up."""
    script = f"sleep 600 & sleep 600 & touch {workspace}/started; wait"
    request = RunRequest(argv=["/bin/sh", "-c", script], timeout=600, output_chars=1000)
    ended: list[RunOutcome | BaseException] = []

    def run() -> None:
        try:
            ended.append(session.run(request))
        except BaseException as exc:  # the server is killed under it
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    server = int(session.ready_info["pid"])
    wait_for((workspace / "started").exists, "the call started")
    found: dict[int, list[int]] = {}

    def call_chain_up() -> bool:
        found.clear()
        found.update({i: b for i, b in chains(server).items() if len(b) >= 3})
        return len(found) == 1

    wait_for(call_chain_up, "the call's init with its shell and two sleepers")
    ((init, below),) = found.items()
    return thread, [init, *below]


@pytest.mark.parametrize("victim", ["zygote", "server"])
def test_a_running_call_dies_with_its_zygote(
    session: ServerSession, workspace: Path, victim: str
) -> None:
    """SIGKILL of the zygote, or of the server above it, takes a running call's init and
    every process of its call, however the call's ids were set."""
    server = int(session.ready_info["pid"])
    zygote = zygote_of(server)
    thread, chain = running_call(session, workspace)
    assert Path(f"/proc/{chain[1]}/status").read_text().count(f"\t{NOBODY}\t") >= 1
    started = {pid: start_time(pid) for pid in chain}
    try:
        os.kill(zygote if victim == "zygote" else server, signal.SIGKILL)
        wait_for(
            lambda: not any(alive(p) and start_time(p) == t for p, t in started.items()),
            f"the call's init and its processes died with the {victim}",
        )
    finally:
        # Whatever is left must not run on past the test.
        for pid, started_at in started.items():
            if start_time(pid) == started_at:
                os.kill(pid, signal.SIGKILL)
        thread.join()


def children_of(parent: int) -> list[int]:
    """The live (not zombie) children of ``parent``."""
    return [pid for pid, state, ppid in processes() if ppid == parent and state != "Z"]


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid``, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def test_the_relay_dies_with_its_server(workspace: Path) -> None:
    """SIGKILL of a server on the host takes its egress relay, which dropped to the calls' uid."""
    # A network namespace of the server's own: its relay listens on 127.0.0.1 there, not on
    # the host's loopback where other tests' relays may listen.
    channel = PipeChannel.spawn(
        ["unshare", "--net", "--", *server_command(sys.executable)], name="parent-death-test"
    )
    policy = attrs.evolve(POLICY, egress_socket=workspace / "proxy.sock")
    with ServerSession.start(
        channel,
        policy,
        backend="parent-death-test",
        confine=True,
        drop_uid=NOBODY,
        drop_gid=NOBODY,
        seccomp=None,
        path_map={str(EGRESS_DIR): str(workspace), "/workspace": str(workspace)},
    ) as session:
        server = int(session.ready_info["pid"])
        # The relay is the server's child that is the calls' uid (the zygote stays root).
        relays: list[int] = []

        def relay_up() -> bool:
            relays[:] = [pid for pid in children_of(server) if uid_of(pid) == NOBODY]
            return len(relays) == 1

        wait_for(relay_up, "the relay, as the calls' uid")
        (relay,) = relays
        started = start_time(relay)
        try:
            os.kill(server, signal.SIGKILL)
            wait_for(
                lambda: not (alive(relay) and start_time(relay) == started),
                "the relay died with its server",
            )
        finally:
            if start_time(relay) == started:
                os.kill(relay, signal.SIGKILL)


def test_root_identity_needs_the_calls_own_user_namespace(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose calls drop to the uid (no user namespace of their own) cannot give
    root_identity, and the turn does not start, saying why."""
    monkeypatch.setattr(_session, "_PROBED", {})
    # The first boot (the real probe) gives it; the second, with the step planted as failed,
    # must refuse.
    with pytest.raises(BackendUnavailableError, match="root_identity here: needs each call in"):
        start(workspace, "user_namespace", attrs.evolve(POLICY, root_identity=True)).close()
