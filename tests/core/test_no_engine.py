"""A Docker engine that did not answer: the message names the socket, its group, and the fix."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from astralvessel.sandbox.docker._no_engine import (
    SocketFacts,
    engine_socket,
    no_engine_message,
    socket_facts,
)

DENIED = (
    "Error while fetching server API version: ('Connection aborted.', "
    "PermissionError(13, 'Permission denied'))"
)


def facts(*, in_group: bool) -> SocketFacts:
    return SocketFacts(
        path="/var/run/docker.sock", group="docker", mode=0o660, in_group=in_group, user="ana"
    )


def test_permission_denied_names_the_socket_and_group() -> None:
    """A user outside the socket's group is told the socket, the group and how to join it."""
    message = no_engine_message(DENIED, "/var/run/docker.sock", facts(in_group=False))
    assert message.startswith(
        "docker cannot start: permission denied on the engine's socket /var/run/docker.sock "
        "(group 'docker', mode 0660); this user (ana) is not in that group"
    )
    assert "usermod -aG docker ana" in message
    assert "start dockerd" not in message


def test_permission_denied_in_the_group_says_log_in_again() -> None:
    """A user just added to the group (not yet in this login's groups) is told to log in again."""
    message = no_engine_message(DENIED, "/var/run/docker.sock", facts(in_group=True))
    assert "log in again" in message
    assert "start dockerd" not in message


def test_no_engine_at_all_says_start_it_and_where() -> None:
    """An engine that is not there is named by its socket, with the advice to start one."""
    message = no_engine_message("FileNotFoundError(2)", "/run/x.sock", None)
    assert message.startswith("docker cannot start: no Docker engine answers at /run/x.sock")
    assert "start dockerd" in message


def test_engine_socket_follows_docker_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket comes from the engine's URL, then DOCKER_HOST; a TCP engine has none."""
    assert engine_socket("unix:///run/a.sock") == "/run/a.sock"
    assert engine_socket("tcp://10.0.0.1:2375") is None
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine_socket(None) == "/var/run/docker.sock"


def test_socket_facts_read_a_real_socket(tmp_path: Path) -> None:
    """The facts are the socket's own: its group's name, its mode, and this process's groups."""
    path = tmp_path / "engine.sock"
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(path))
        path.chmod(0o660)
        found = socket_facts(str(path))
    finally:
        listener.close()
    assert found is not None
    assert found.mode == 0o660
    assert found.in_group is True  # the socket has this process's own group
    assert socket_facts(str(tmp_path / "absent.sock")) is None
