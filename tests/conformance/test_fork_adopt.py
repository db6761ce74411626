"""Forks that adopt an executor's warm sandboxes (``Executor(warm=N)``, ``_executor._adopt``).

A warm sandbox started before the fork, its workspace empty, takes the fork's
frozen layer and its server lays the workspace's overlay on it then. Only a
sandbox nothing has touched may be adopted; a fork so opened sees its parent's
files and keeps its writes to itself; an adoption that fails closes that sandbox,
and the fork opens as it would without one. Every backend with a server adopts:
bubblewrap's and nsjail's get the socket the layer comes on at spawn, Docker's with
their hello over the direct channel (``sandbox/docker/_adoption``), where the host's
reader makes the layer the fork's uid's first.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from astralvessel import Executor
from astralvessel.errors import SandboxError
from astralvessel.sandbox import Sandbox
from astralvessel.sandbox._session import ServerSession

from .calls import run, run_script
from .conftest import suite_executor


@pytest.fixture
def warm(backend: Sandbox, agent_dir: Path, data_dir: Path) -> Iterator[Executor]:
    """An executor of the backend under test keeping four warm sandboxes, all started."""
    if backend.name == "docker-exec":
        pytest.skip("docker-exec runs no sandbox server: its turns take no snapshot")
    with suite_executor(backend, agent_dir, data_dir, warm=4) as opened:
        assert opened.wait_warm(120)
        yield opened


def warm_sessions(executor: Executor) -> list[ServerSession]:
    """The sandboxes the executor's warm pool holds ready now."""
    pool = executor._warm
    assert pool is not None
    return [s for s in pool._ready if isinstance(s, ServerSession)]


def adoptable_session(executor: Executor) -> ServerSession:
    """A sandbox started as the executor's warm ones are (adoptable), by hand."""
    policy = attrs.evolve(executor.policy, adoptable=True)
    session = executor.sandbox.start(policy)
    assert isinstance(session, ServerSession)
    assert session.adopt_socket is not None
    return session


def frozen_fork_layer(executor: Executor) -> tuple[object, int]:
    """A fork of a turn holding ``f`` = base (kept open: its layer lives with it) and a
    descriptor of its frozen layer that the test closes."""
    from astralvessel._executor._adopt import _layers_of

    with executor.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        (fork,) = parent.fork(1, ready=0)
    snapshot = fork.snapshot_source
    assert snapshot is not None
    with _layers_of(snapshot) as (layer,):
        return fork, os.dup(layer)


def test_forks_adopt_the_warm_sandboxes(warm: Executor):
    """Each fork's sandbox is one of the warm ones, its workspace laid on the fork's layer."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        waiting = set(map(id, warm_sessions(warm)))
        forks = parent.fork(2)
    try:
        for fork in forks:
            assert run_script(fork, "cat /workspace/f") == "base\n"
            assert id(fork._session) in waiting
            relaxations = fork.session.ready_info.get("relaxations") or {}  # type: ignore[attr-defined]
            assert relaxations.get("workspace_lower") is True
    finally:
        for fork in forks:
            fork.close()


def test_fork_returns_once_its_forks_adopted_the_warm_sandboxes_ready(warm: Executor):
    """An adoption takes milliseconds, not a sandbox's start, so ``fork`` (with its
    default ``ready=1``) returns once as many forks as there were warm sandboxes ready
    have adopted one: their first calls, one after another, wait for none. The forks
    beyond those start as before."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        assert warm.wait_warm(120)
        waiting = set(map(id, warm_sessions(warm)))
        assert len(waiting) == 4
        forks = parent.fork(6)
    try:
        snapshot = forks[0].snapshot_source
        assert snapshot is not None
        held, ahead = warm._ahead[id(snapshot)]
        assert held() is snapshot
        assert ahead.ready >= 4
        adopted = [s for s in ahead._ready if id(s) in waiting]
        assert len(adopted) == 4
        for fork in forks:
            assert run_script(fork, "cat /workspace/f") == "base\n"
    finally:
        for fork in forks:
            fork.close()


def test_adopted_forks_keep_their_writes_apart(warm: Executor):
    """A fork opened on a warm sandbox sees its parent's files; its writes reach neither
    its siblings nor its parent, which goes on."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f; mkdir /workspace/d; echo in > /workspace/d/g")
        forks = parent.fork(3)
        try:
            for index, fork in enumerate(forks):
                assert (
                    run_script(fork, f"cat /workspace/f; echo {index} > /workspace/f") == "base\n"
                )
                run_script(fork, f"rm -r /workspace/d; echo {index} > /workspace/own{index}")
            for index, fork in enumerate(forks):
                assert run_script(fork, "cat /workspace/f; ls /workspace") == (
                    f"{index}\nf\noutbox\nown{index}\n"
                )
            assert run_script(parent, "cat /workspace/f /workspace/d/g; ls /workspace") == (
                "base\nin\nd\nf\noutbox\n"
            )
        finally:
            for fork in forks:
                fork.close()


def test_a_sandbox_that_ran_a_call_is_not_adopted(warm: Executor):
    """Once a call ran in it, a warm sandbox refuses a fork's layer: what the call did
    could live on under the fork's files."""
    fork, layer = frozen_fork_layer(warm)
    session = adoptable_session(warm)
    try:
        run(session, "sh", "-c", "echo left > /workspace/left")
        with pytest.raises(SandboxError, match="cannot be adopted"):
            session.adopt(layer, 10.0)
        assert run(session, "sh", "-c", "ls -A /workspace").output == "left\noutbox\n"
    finally:
        session.close()
        os.close(layer)
        fork.close()  # type: ignore[attr-defined]


def test_the_server_refuses_an_adoption_after_a_call(warm: Executor):
    """A host that asks for an adoption anyway after a call is refused by the server
    itself (EBUSY), and the workspace stays the call's."""
    from astralvessel.sandbox._requests import AdoptRequest

    session = adoptable_session(warm)
    try:
        run(session, "sh", "-c", "echo left > /workspace/left")
        reply = session._ask(AdoptRequest(timeout=10.0))
        assert reply.errno == "EBUSY"
        assert run(session, "sh", "-c", "ls -A /workspace").output == "left\noutbox\n"
    finally:
        session.close()


def test_a_sandbox_asked_for_a_file_first_refuses_the_layer(warm: Executor):
    """A file request counts as a touch too: the server refuses the layer after one, even
    where the host passes it anyway (the socket closed, nothing comes on it)."""
    from astralvessel.sandbox import FsRequest

    fork, layer = frozen_fork_layer(warm)
    session = adoptable_session(warm)
    try:
        reply = session.fs(FsRequest(op="list", path="/workspace", timeout=10.0))
        assert reply.errno is None
        with pytest.raises(SandboxError):
            session.adopt(layer, 10.0)
        assert run(session, "sh", "-c", "ls /workspace").output == "outbox\n"
    finally:
        session.close()
        os.close(layer)
        fork.close()  # type: ignore[attr-defined]


def test_a_sandbox_adopts_once(warm: Executor):
    """A second layer is refused: an adopted workspace is never laid again."""
    fork, layer = frozen_fork_layer(warm)
    session = adoptable_session(warm)
    try:
        session.adopt(layer, 10.0)
        with pytest.raises(SandboxError):
            session.adopt(layer, 10.0)
        assert run(session, "sh", "-c", "cat /workspace/f").output == "base\n"
    finally:
        session.close()
        os.close(layer)
        fork.close()  # type: ignore[attr-defined]


def test_what_is_no_layer_is_refused_and_leaves_the_workspace(warm: Executor, tmp_path: Path):
    """A descriptor that is no mount is refused, and the workspace stays the empty tmpfs."""
    session = adoptable_session(warm)
    bogus = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SandboxError, match=r"refused|cannot be made this sandbox's"):
            session.adopt(bogus, 10.0)
        assert run(session, "sh", "-c", "ls -A /workspace").output == "outbox\n"
    finally:
        os.close(bogus)
        session.close()


def test_what_is_no_layer_is_refused_by_the_server_too(warm: Executor, tmp_path: Path):
    """Docker's host makes the layer the sandbox's first (its reader idmaps it, which a
    folder is refused); a descriptor that reaches the server as it is, over the socket the
    hello brought, is refused there, and the workspace stays the empty tmpfs."""
    session = adoptable_session(warm)
    session.fit_layer = None
    bogus = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SandboxError, match="refused the fork's layer"):
            session.adopt(bogus, 10.0)
        assert run(session, "sh", "-c", "ls -A /workspace").output == "outbox\n"
    finally:
        os.close(bogus)
        session.close()


def test_calls_of_an_adoptable_sandbox_hold_no_socket(warm: Executor):
    """The socket a layer would come on is the server's alone: a call inherits no socket."""
    session = adoptable_session(warm)
    try:
        listing = run(session, "sh", "-c", "ls -l /proc/self/fd/").output
        assert "socket:" not in listing
    finally:
        session.close()


def test_a_failed_adoption_closes_that_sandbox_and_the_fork_starts_its_own(
    warm: Executor, monkeypatch: pytest.MonkeyPatch
):
    """An adoption that fails never serves the fork: that warm sandbox is closed, and the
    fork opens with its files as it would without one."""
    refused: list[ServerSession] = []

    def refuse(self: ServerSession, layer: int, timeout: float, below: Sequence[int] = ()) -> None:
        refused.append(self)
        raise SandboxError(f"refused: {errno.errorcode[errno.EPERM]}")

    def refuse_laid(self: ServerSession, lower: object, timeout: float) -> None:
        refused.append(self)
        raise SandboxError(f"refused: {errno.errorcode[errno.EPERM]}")

    monkeypatch.setattr(ServerSession, "adopt", refuse)
    # Root's Docker host lays the overlay itself (``adopt_laid``): refused alike.
    monkeypatch.setattr(ServerSession, "adopt_laid", refuse_laid)
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        (fork,) = parent.fork(1)
    with fork:
        assert run_script(fork, "cat /workspace/f; echo mine > /workspace/f") == "base\n"
        assert all(session is not fork._session for session in refused)
    assert all(not session.alive() for session in refused)
    assert refused


def test_many_forks_adopt_from_many_threads(warm: Executor):
    """Eight forks called at once from eight threads, more than the warm sandboxes: each
    sees the parent's files and its own writes alone."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        forks = parent.fork(8)
    seen: dict[int, str] = {}
    errors: list[BaseException] = []

    def use(index: int) -> None:
        try:
            fork = forks[index]
            run_script(fork, f"cat /workspace/f > /dev/null; echo {index} > /workspace/f")
            seen[index] = run_script(fork, "cat /workspace/f")
        except BaseException as exc:  # read by the test: a thread's error is not raised there
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert seen == {index: f"{index}\n" for index in range(8)}
    finally:
        for fork in forks:
            fork.close()


def test_an_adopted_forks_snapshot_holds_its_own_files(warm: Executor):
    """A snapshot of a fork opened on a warm sandbox is its parent's files with the
    fork's changes, as any fork's is; a turn opened from it sees exactly those."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f; echo gone > /workspace/g")
        (fork,) = parent.fork(1)
    with fork:
        run_script(fork, "echo mine > /workspace/f; rm /workspace/g; echo new > /workspace/h")
        snapshot = fork.snapshot()
    with warm.turn(snapshot=snapshot) as again:
        assert run_script(again, "cat /workspace/f /workspace/h; ls /workspace") == (
            "mine\nnew\nf\nh\noutbox\n"
        )


def test_an_adopted_sandboxs_calls_hold_what_any_calls_do(warm: Executor):
    """Neither the layer nor the socket it came on reaches a call of the adopted sandbox:
    its calls hold the descriptors a call of a sandbox never adoptable holds."""
    fork, layer = frozen_fork_layer(warm)
    session = adoptable_session(warm)
    plain = warm.sandbox.start(warm.policy)
    listing = "ls /proc/self/fd/; ls -l /proc/self/fd/ | grep -c -e socket: -e anon_inode:"
    try:
        session.adopt(layer, 10.0)
        assert run(session, "sh", "-c", "cat /workspace/f").output == "base\n"
        assert run(session, "sh", "-c", listing).output == run(plain, "sh", "-c", listing).output
    finally:
        plain.close()
        session.close()
        os.close(layer)
        fork.close()  # type: ignore[attr-defined]


def test_an_adopted_forks_writes_count_against_its_disk(warm: Executor):
    """The overlay's upper layer lies in the adopted sandbox's workspace tmpfs: a fork's
    writes past ``disk_mb`` fail there as any turn's do, and its parent's files stay."""
    too_much = warm.policy.limits.disk_mb * 2
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        waiting = set(map(id, warm_sessions(warm)))
        (fork,) = parent.fork(1)
    with fork:
        written = run_script(
            fork, f"head -c {too_much}M /dev/zero > /workspace/big 2>/dev/null || echo full"
        )
        assert id(fork._session) in waiting
        assert written == "full\n"
        assert run_script(fork, "rm /workspace/big; cat /workspace/f") == "base\n"


def test_a_hello_naming_an_adoption_socket_it_did_not_bring_is_never_adopted(
    warm: Executor, monkeypatch: pytest.MonkeyPatch
):
    """Over Docker's direct channel the adoption socket comes with the hello: one that
    names it without passing it (whatever number it names) leaves the server none, and
    an adoption asked anyway is refused before anything is laid."""
    from astralvessel.sandbox import _session
    from astralvessel.sandbox._requests import AdoptRequest

    if warm.sandbox.name != "docker":
        pytest.skip("the namespace backends' servers inherit the socket at its number")
    monkeypatch.setattr(_session, "_passed_with_hello", lambda policy, options: ())
    session = adoptable_session(warm)
    try:
        reply = session._ask(AdoptRequest(timeout=10.0))
        assert reply.errno == errno.errorcode[errno.EOPNOTSUPP]
        assert "without an adoption socket" in reply.message
        assert run(session, "sh", "-c", "ls -A /workspace").output == "outbox\n"
    finally:
        session.close()


def test_warm_sandboxes_on_the_attach_stream_are_left_to_turns(
    backend: Sandbox, agent_dir: Path, data_dir: Path
):
    """A Docker engine without the direct channel can pass no socket: its warm sandboxes
    are never adoptable, and a fork leaves them to later turns rather than take one only
    to close it."""
    from astralvessel.sandbox.docker import Docker

    if backend.name != "docker":
        pytest.skip("only Docker has a channel that may carry no descriptor")
    assert isinstance(backend, Docker)
    attached = Docker(image=backend.image, base_image=backend.base_image, direct=False)
    assert not attached.adopts_warm_here()
    with suite_executor(attached, agent_dir, data_dir, warm=2) as executor:
        with executor.turn() as parent:
            run_script(parent, "echo base > /workspace/f")
            assert executor.wait_warm(120)
            waiting = warm_sessions(executor)
            assert len(waiting) == 2
            assert all(session.adopt_socket is None for session in waiting)
            (fork,) = parent.fork(1)
        with fork:
            assert run_script(fork, "cat /workspace/f") == "base\n"
            assert all(fork._session is not session for session in waiting)
        assert all(session.alive() for session in waiting)
        assert warm_sessions(executor) == waiting


def test_a_fork_of_an_adopted_fork_has_its_files_then(warm: Executor):
    """An adopted fork forks as any turn does: its own fork sees the parent's files with
    the adopted fork's changes as they were at the fork, none made after."""
    with warm.turn() as parent:
        run_script(parent, "echo base > /workspace/f")
        waiting = set(map(id, warm_sessions(warm)))
        (fork,) = parent.fork(1)
    with fork:
        assert run_script(fork, "cat /workspace/f; echo mine > /workspace/g") == "base\n"
        assert id(fork._session) in waiting
        (grandchild,) = fork.fork(1)
        run_script(fork, "echo after > /workspace/g")
    with grandchild:
        assert run_script(grandchild, "cat /workspace/f /workspace/g") == "base\nmine\n"
