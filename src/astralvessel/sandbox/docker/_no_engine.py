"""What to tell a host whose Docker engine did not answer: which socket, and why not.

"start dockerd" is wrong advice when the engine runs and this user may not open its socket:
then the message names the socket, its group and what to do. The reading of the socket's
owner is the only I/O; the wording is a pure function of those facts.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

import attrs

__all__ = ["SocketFacts", "engine_socket", "no_engine_message", "socket_facts"]

#: Where the Docker SDK looks when neither DOCKER_HOST nor a context names an engine.
DEFAULT_SOCKET = "/var/run/docker.sock"


@attrs.frozen(kw_only=True)
class SocketFacts:
    """The engine socket's owner and mode, and whether this process's groups include its group."""

    path: str
    group: str
    mode: int
    in_group: bool
    user: str


def engine_socket(base_url: str | None) -> str | None:
    """The unix socket the engine is reached by, or None for a TCP or SSH engine."""
    url = base_url or os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    return url.removeprefix("unix://") if url.startswith("unix://") else None


def socket_facts(path: str) -> SocketFacts | None:
    """The owner facts of the socket at ``path``, or None when it cannot be looked at."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return SocketFacts(
        path=path,
        group=group,
        mode=stat.S_IMODE(info.st_mode),
        in_group=info.st_gid in {os.getegid(), *os.getgroups()},
        user=user,
    )


def no_engine_message(failure: str, socket: str | None, facts: SocketFacts | None) -> str:
    """The ``BackendUnavailableError`` text for an engine that did not answer."""
    if facts is not None and "Permission denied" in failure:
        if facts.in_group:
            why = f"this user ({facts.user}) is in its group but the socket refused it"
            fix = "log in again so the new group applies, or check the socket's mode"
        else:
            why = f"this user ({facts.user}) is not in that group"
            fix = (
                f"add the user to it (usermod -aG {facts.group} {facts.user}, then log in "
                "again), or set DOCKER_HOST to an engine this user may use (rootless Docker, "
                "Podman's socket)"
            )
        return (
            f"docker cannot start: permission denied on the engine's socket {facts.path} "
            f"(group {facts.group!r}, mode {facts.mode:04o}); {why}: {fix}"
        )
    where = f" at {socket}" if socket else ""
    return (
        f"docker cannot start: no Docker engine answers{where} ({failure}); start dockerd "
        "(or Podman's Docker-compatible socket) or set DOCKER_HOST"
    )
