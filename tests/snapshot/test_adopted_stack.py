"""A fork of a fork adopts one of the executor's warm sandboxes (bubblewrap, nsjail and
Docker, as root and as an ordinary user): the host passes every layer of its stack, top
first, in one message over the sandbox's adoption socket (an ordinary user's Docker host
fits each to the sandbox's uid first), and the server lays the overlay on them all, as a
cold fork's hello would (``_executor._adopt``, ``server/_adopt``). Root's Docker layers
carry ``trusted.*`` attributes a container's server cannot read: its host lays the
overlay itself and moves it onto the container's workspace, and the server only checks
it (``Adopt.laid``: ``test_roots_docker_fork_of_a_stack_adopts_with_the_hosts_overlay``).

A sandbox adopted is told from one started by being among the warm pool's ready ones
before the fork. What the server refuses (a stack past ``MAX_LAYERS``, a descriptor that
is no frozen layer, a second adoption, a touched sandbox) leaves the workspace as it was,
and the fork opens as it would without a warm pool. Real sandboxes, no mocks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from astralvessel import Executor, Registry
from astralvessel._executor._adopt import _layers_of, adoptable
from astralvessel.errors import SandboxError
from astralvessel.sandbox._requests import AdoptRequest
from astralvessel.sandbox._session import ServerSession
from astralvessel.sandbox.server._messages import MAX_LAYERS

from ..conformance.calls import run
from .test_frozen_fork import _MAKE, _sh
from .test_frozen_stack import _CHANGE, _layers

#: What each turn's view shows of the stack's files (the parent's, changed by the child's).
_VIEW = "cd /workspace && ls -A . d/e link && cat d/e/h shared d/f3 link/x mine"


ROOT = os.geteuid() == 0
#: Root's Docker host lays the overlay itself (``adopt_laid``): it passes no layer.
docker_passing = pytest.mark.skipif(ROOT, reason="root's Docker host passes no layer to refuse")


@pytest.fixture(params=["bubblewrap", "nsjail", "docker"])
def warm(request: pytest.FixtureRequest) -> Iterator[Executor]:
    """An executor keeping three warm sandboxes."""
    with Executor(Registry(), sandbox=request.param, warm=3) as executor:
        yield executor


def _ready_warm(executor: Executor) -> list[ServerSession]:
    """The executor's warm sandboxes, once all are started."""
    assert executor.wait_warm(120)
    pool = executor._warm
    assert pool is not None
    return [s for s in pool._ready if isinstance(s, ServerSession)]


def _adopted(turn: Any, waiting: list[ServerSession]) -> bool:
    """Whether the turn's sandbox is one of the warm ones (its first call made already)."""
    return any(turn._session is session for session in waiting)


def _changed_child(executor: Executor) -> tuple[Any, Any]:
    """A fresh turn with ``_MAKE``'s files and its fork, changed by ``_CHANGE``."""
    parent = executor.turn()
    _sh(parent, _MAKE)
    (child,) = parent.fork(1)
    _sh(child, _CHANGE)
    return parent, child


def test_forks_of_a_fork_adopt_warm_sandboxes_and_write_apart(warm: Executor) -> None:
    parent, child = _changed_child(warm)
    with parent, child:
        waiting = _ready_warm(warm)
        forks = child.fork(2)
        try:
            expected = _sh(child, _VIEW)
            assert adoptable(forks[0].snapshot_source, warm.sandbox.name)
            for fork in forks:
                assert len(_layers(fork.snapshot_source)) == 2
                assert _sh(fork, _VIEW) == expected
                assert _adopted(fork, waiting), "the fork of a fork started its own sandbox"
                relaxations = fork.session.ready_info.get("relaxations") or {}
                assert relaxations.get("workspace_lower") is True
            _sh(forks[0], "cd /workspace && echo 0 > mine && rm d/f4 && echo 0 > own")
            _sh(forks[1], "cd /workspace && echo 1 > mine && rm -r d/e")
            assert _sh(forks[0], "cd /workspace && cat mine own && ls d/e") == "0\n0\nh\n"
            assert _sh(forks[1], "cd /workspace && cat mine d/f4 | wc -c && ls") == (
                "16386\nd\nlink\nmine\noutbox\nshared\n"
            )
            assert (
                _sh(child, "cd /workspace && cat mine && ls d/e d/f4") == "mine\nd/f4\n\nd/e:\nh\n"
            )
            assert _sh(parent, "cd /workspace && ls") == "d\nlink\noutbox\nshared\n"
        finally:
            for fork in forks:
                fork.close()


def test_a_fork_of_an_adopted_fork_of_a_fork_stacks_again(warm: Executor) -> None:
    """The adopted sandbox keeps what a later freeze needs (the overlay's lower layers, an
    ordinary user's held tmpfs): its fork stacks a third layer, and adopts one too."""
    parent, child = _changed_child(warm)
    with parent, child:
        waiting = _ready_warm(warm)
        (grandchild,) = child.fork(1)
        with grandchild:
            _sh(grandchild, "cd /workspace && rm mine && mkdir mine && echo 3 > mine/three")
            assert _adopted(grandchild, waiting)
            source = grandchild.snapshot_source
            waiting = _ready_warm(warm)
            (third,) = grandchild.fork(1)
            with third:
                view = "cd /workspace && ls -A . mine && cat mine/three shared d/e/h"
                assert _sh(third, view) == _sh(grandchild, view)
                assert _adopted(third, waiting)
                deeper = third.snapshot_source
                assert deeper is not None
                assert len(_layers(deeper)) == 3, "the adopted fork's freeze did not stack"
                assert _layers(deeper)[1:] == _layers(source)
                _sh(third, "cd /workspace && echo mine > mine/three")
                assert _sh(grandchild, "cat /workspace/mine/three") == "3\n"


def test_a_touched_warm_sandbox_is_closed_and_the_fork_of_a_fork_starts_its_own(
    warm: Executor,
) -> None:
    """A warm sandbox that served a call is never handed the stack: the host closes it,
    and the fork of a fork opens on its layers as it would without a warm pool."""
    parent, child = _changed_child(warm)
    with parent, child:
        touched = _ready_warm(warm)
        for session in touched:
            run(session, "sh", "-c", "echo left > /workspace/left")
        (grandchild,) = child.fork(1)
        with grandchild:
            assert _sh(grandchild, _VIEW) == _sh(child, _VIEW)
            assert not _adopted(grandchild, touched)
            assert "left" not in _sh(grandchild, "ls /workspace")
            assert len(_layers(grandchild.snapshot_source)) == 2
        # The one the fork took was closed (the others wait in the pool, refused alike).
        assert any(not session.alive() for session in touched)


def _adoptable(executor: Executor) -> ServerSession:
    """A sandbox started as the executor's warm ones are (adoptable), by hand."""
    session = executor.sandbox.start(attrs.evolve(executor.policy, adoptable=True))
    assert isinstance(session, ServerSession)
    return session


def _refused(executor: Executor, layers: tuple[int, ...], match: str) -> None:
    """A fresh adoptable sandbox refuses ``layers``, its workspace left empty."""
    session = _adoptable(executor)
    try:
        with pytest.raises(SandboxError, match=match):
            session.adopt(layers[0], 10.0, layers[1:])
        assert run(session, "sh", "-c", "ls -A /workspace").output == "outbox\n"
    finally:
        session.close()


#: How a folder among the layers is refused: by the server, or by Docker's host, whose
#: reader cannot make it the sandbox's (no mount of its own to idmap).
_NO_LAYER = {
    "bubblewrap": "layer 2 is no read-only mount",
    "nsjail": "layer 2 is no read-only mount",
    "docker": "cannot be made this sandbox's",
}


@pytest.mark.parametrize(
    "warm", ["bubblewrap", "nsjail", pytest.param("docker", marks=docker_passing)], indirect=True
)
def test_the_server_refuses_what_is_no_stack_of_layers(warm: Executor, tmp_path: Path) -> None:
    """Too many layers, or a folder among them that is no read-only mount: refused by the
    server before anything is laid. A stack laid is never laid again."""
    parent, child = _changed_child(warm)
    with parent, child:
        (grandchild,) = child.fork(1, ready=0)
        with grandchild:
            source = grandchild.snapshot_source
            assert source is not None
            folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with _layers_of(source) as stack:
                    assert len(stack) == 2
                    _refused(warm, stack * MAX_LAYERS, f"E2BIG.*{MAX_LAYERS} at most")
                    _refused(warm, (*stack, folder), _NO_LAYER[warm.sandbox.name])
                    session = _adoptable(warm)
                    try:
                        session.adopt(stack[0], 10.0, stack[1:])
                        with pytest.raises(SandboxError, match="cannot be adopted"):
                            session.adopt(stack[0], 10.0, stack[1:])
                        assert run(session, "sh", "-c", "cat /workspace/mine").output == "mine\n"
                    finally:
                        session.close()
            finally:
                os.close(folder)


@pytest.mark.skipif(not ROOT, reason="only root's host lays an overlay (an ordinary user's passes)")
def test_roots_docker_fork_of_a_stack_adopts_with_the_hosts_overlay() -> None:
    """Root's Docker stack (its opaque folders ``trusted.*`` attributes) is laid by the
    host on a warm sandbox: a folder the fork removed and made again shows the fork's
    files alone, and the adopted fork's own layer stacks when it is forked in turn."""
    with Executor(Registry(), sandbox="docker", warm=3) as warm:
        parent, child = _changed_child(warm)
        with parent, child:
            waiting = _ready_warm(warm)
            (grandchild,) = child.fork(1)
            with grandchild:
                assert len(_layers(grandchild.snapshot_source)) == 2
                assert _sh(grandchild, _VIEW) == _sh(child, _VIEW)
                assert _adopted(grandchild, waiting)
                assert _sh(grandchild, "ls /workspace/d/e") == "h\n"  # not the parent's g
                assert grandchild.session.upper_names is not None
                _sh(grandchild, "cd /workspace && rm -r d && mkdir d && echo new > d/n")
                (third,) = grandchild.fork(1, ready=0)
                with third:
                    assert len(_layers(third.snapshot_source)) == 3
                    assert _sh(third, "ls /workspace/d") == "n\n"


@pytest.mark.skipif(not ROOT, reason="only root's host lays an overlay (an ordinary user's passes)")
def test_roots_docker_host_lays_a_stack_once() -> None:
    """Root's Docker host lays a stack's overlay once: an overlay laid is never laid
    again, and too many layers are refused before any is laid."""
    with Executor(Registry(), sandbox="docker") as executor:
        parent, child = _changed_child(executor)
        with parent, child:
            (grandchild,) = child.fork(1, ready=0)
            with grandchild:
                source = grandchild.snapshot_source
                assert source is not None
                stack = tuple(str(layer.path) for layer in source.stack)
                session = _adoptable(executor)
                try:
                    with pytest.raises(SandboxError, match="cannot be laid"):
                        session.adopt_laid(stack * MAX_LAYERS, 10.0)
                finally:
                    session.close()
                session = _adoptable(executor)
                try:
                    session.adopt_laid(stack, 10.0)
                    with pytest.raises(SandboxError, match="cannot be adopted"):
                        session.adopt_laid(stack, 10.0)
                    assert run(session, "sh", "-c", "cat /workspace/mine").output == "mine\n"
                finally:
                    session.close()


def _laid_refusal(session: ServerSession) -> str:
    """What the server answers an adoption the host says it laid (``Adopt.laid``)."""
    reply = session._ask(AdoptRequest(timeout=10.0, laid=True))
    return f"{reply.errno}: {reply.message}"


def test_the_server_refuses_an_overlay_the_host_did_not_lay(warm: Executor) -> None:
    """An adoption said laid by the host is refused where the workspace is still the
    sandbox's own tmpfs, where a layer came with it all the same, and once the sandbox
    served a request: its workspace is left as it was."""
    session = _adoptable(warm)
    try:
        assert _laid_refusal(session).startswith("EINVAL: the workspace is no overlay")
        assert _laid_refusal(session).startswith("EBUSY")  # once only
        assert run(session, "sh", "-c", "ls -A /workspace").output == "outbox\n"
    finally:
        session.close()
    session = _adoptable(warm)
    try:
        assert session.adopt_socket is not None
        folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        try:
            socket.send_fds(session.adopt_socket, [b"L"], [folder])
        finally:
            os.close(folder)
        assert _laid_refusal(session).startswith("EINVAL: a layer was passed")
    finally:
        session.close()
    session = _adoptable(warm)
    try:
        run(session, "sh", "-c", "echo left > /workspace/left")
        assert _laid_refusal(session).startswith("EBUSY")
        assert run(session, "sh", "-c", "cat /workspace/left").output == "left\n"
    finally:
        session.close()
