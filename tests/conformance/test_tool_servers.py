"""The ``tool_servers`` relaxation, attacked: unix sockets, sessions and terminals, within the turn.

``Policy(tool_servers=True)`` lets a long-lived tool server (inspect's sandbox
tools) listen on a unix socket, start a session and give a shell a terminal.
Each test opens a turn with it and checks that what it gives works, and that
it reaches no further: a socket finds nothing of the host's, a terminal is the
call's own, /dev stays closed to writes, and a new session still ends with its
call.
"""

from __future__ import annotations

import errno
import os
import socket
import textwrap
import time
from collections.abc import Iterator

import pytest

from astralvessel import Executor, Registry, Turn
from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import Policy, Sandbox
from astralvessel.sandbox._discovery import get_backend

from .calls import PYTHON, wait_until_gone
from .conftest import TEST_LIMITS
from .test_identity import DEVICES

#: Every backend that runs the sandbox server; ``docker-exec`` refuses it (tested below).
SERVER_BACKENDS = ["bubblewrap", "nsjail", "docker"]


@pytest.fixture(params=SERVER_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Sandbox:
    """A backend with a sandbox server, found by name."""
    return get_backend(request.param)


@pytest.fixture
def turn(backend: Sandbox) -> Iterator[Turn]:
    """A turn with ``tool_servers``, closed after the test."""
    executor = Executor(
        Registry(), sandbox=backend, limits=TEST_LIMITS, tool_servers=True, timeout_seconds=30.0
    )
    with executor, executor.turn() as opened:
        yield opened


def _python(turn: Turn, code: str) -> str:
    result = turn.exec([PYTHON, "-c", textwrap.dedent(code)])
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


ECHO_SERVER = """
import os, socket
server = socket.socket(socket.AF_UNIX)
server.bind("/workspace/echo.sock")
server.listen(4)
while True:
    conn, _ = server.accept()
    conn.sendall(b"echo " + conn.recv(100))
    conn.close()
"""


def test_a_detached_server_answers_calls_on_a_unix_socket(turn: Turn):
    """A detached server listens on a unix socket in the workspace; later calls talk to it."""
    server = turn.start([PYTHON, "-c", ECHO_SERVER])
    client = """
    import socket, time
    for _ in range(300):
        try:
            conn = socket.socket(socket.AF_UNIX)
            conn.connect("/workspace/echo.sock")
            break
        except OSError:
            time.sleep(0.05)
    conn.sendall(b"otter")
    print(conn.recv(100).decode())
    """
    assert _python(turn, client) == "echo otter\n"
    assert _python(turn, client) == "echo otter\n"
    assert server.poll() is None
    server.kill()


def test_a_host_abstract_socket_is_out_of_reach(turn: Turn):
    """A unix socket the host listens on in the abstract namespace refuses every call."""
    name = f"astralvessel-host-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX) as host:
        host.bind("\0" + name)
        host.listen(1)
        code = f"""
        import socket
        try:
            socket.socket(socket.AF_UNIX).connect("\\0{name}")
            print("connected")
        except OSError as exc:
            print(exc.errno)
        """
        assert _python(turn, code).strip() == str(errno.ECONNREFUSED)


HOLDER = """
import os, pty, time
master, follower = pty.openpty()
with open("/workspace/tty", "w") as out:
    out.write(os.ttyname(follower))
time.sleep(1000)
"""


def test_each_call_has_terminals_of_its_own(turn: Turn):
    """A call holds a pseudo-terminal; another call meanwhile sees none of it, and gets its own."""
    holder = turn.start([PYTHON, "-c", HOLDER])
    deadline = time.monotonic() + 30
    while turn.exec(["test", "-s", "/workspace/tty"]).returncode != 0:
        assert time.monotonic() < deadline, "the holder never opened its terminal"
        time.sleep(0.05)
    assert turn.read_file("/workspace/tty") == b"/dev/pts/0"
    other = """
    import os, pty
    seen = sorted(os.listdir("/dev/pts"))
    master, follower = pty.openpty()
    print(seen, os.ttyname(follower))
    """
    assert _python(turn, other).strip() == "['ptmx'] /dev/pts/0"
    assert holder.poll() is None
    holder.kill()


def test_dev_holds_only_the_devices_and_the_terminals_and_refuses_writes(turn: Turn):
    """/dev is the usual devices plus ptmx and pts, and a call can add nothing to it."""
    listing = _python(turn, "import os; print(sorted(os.listdir('/dev')))")
    assert set(eval(listing)) == DEVICES | {"ptmx", "pts"}  # noqa: S307 - our own output
    for target in ("/dev/x", "/dev/pts/x"):
        assert turn.exec(["touch", target]).returncode != 0
    assert turn.exec(["sh", "-c", "echo fine > /dev/null"]).returncode == 0


def test_a_new_session_still_ends_with_its_call(turn: Turn):
    """A process that starts a session of its own is killed when its call returns."""
    marker = f"tool-session-{os.getpid()}-{os.urandom(4).hex()}"
    daemon = "import os, time; os.setsid(); open('/workspace/up', 'w').close(); time.sleep(1000)"
    script = f'{PYTHON} -c "{daemon}" {marker} & while [ ! -e /workspace/up ]; do sleep 0.05; done'
    result = turn.exec(["sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert wait_until_gone(marker, 20) == []


def test_without_it_sockets_sessions_and_terminals_stay_refused(backend: Sandbox):
    """A turn without ``tool_servers`` refuses a unix socket, a session and a terminal."""
    code = """
    import os, pty, socket
    found = []
    for attempt in (lambda: socket.socket(socket.AF_UNIX), os.setsid, pty.openpty):
        try:
            attempt()
            found.append("allowed")
        except OSError:
            found.append("refused")
    print(found)
    """
    executor = Executor(Registry(), sandbox=backend, limits=TEST_LIMITS)
    with executor, executor.turn() as turn:
        assert _python(turn, code).strip() == "['refused', 'refused', 'refused']"


def test_docker_exec_refuses_tool_servers():
    """docker-exec, which runs no server, refuses the relaxation instead of ignoring it."""
    with pytest.raises(BackendUnavailableError, match="tool_servers"):
        get_backend("docker-exec").start(Policy(limits=TEST_LIMITS, tool_servers=True)).close()
