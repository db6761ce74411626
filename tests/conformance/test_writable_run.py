"""A writable root with a network allow-list: ``/run`` is the turn's, ``/run/egress`` is not.

The egress proxy's socket folder is bound at ``/run/egress``, inside a root
directory that ``writable_root`` makes writable. These tests check on every
backend with a sandbox server that both hold at once: root tools that lock
under ``/run`` (``adduser``) work, and no call can write, remove, rename or
replace the socket folder, so the server's relay still reaches the host's
proxy after the calls have done their worst.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import attrs
import pytest

from astralvessel import Executor, Turn
from astralvessel.registry import Registry
from astralvessel.sandbox._discovery import get_backend

from .conftest import TEST_LIMITS

#: A writable root seeds every directory of /usr into the workspace: room for it.
LIMITS = attrs.evolve(TEST_LIMITS, disk_mb=64)
#: Every backend that runs the sandbox server (``docker-exec`` refuses a writable root).
SERVER_BACKENDS = ["bubblewrap", "nsjail", "docker"]
OpenTurn = Callable[..., Turn]

#: Fetch an unlisted host through the proxy variables: the host's proxy answers 403 with
#: its own message, which proves the relay reached it (the machine needs no internet).
FETCH = """
import json, urllib.request, urllib.error
try:
    urllib.request.urlopen("http://unlisted.test/", timeout=20)
    print(json.dumps({"status": 200, "body": ""}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
except OSError as error:
    print(json.dumps({"status": None, "body": str(error)}))
"""

#: Each way a call could try to take the socket folder's place, as a shell step.
ATTACKS = {
    "write inside": "touch /run/egress/x",
    "replace the socket": "rm -f /run/egress/proxy.sock",
    "remove": "rm -rf /run/egress",
    "rename": "mv /run/egress /run/egress.old",
    "cover": "mount -t tmpfs none /run/egress",
    "swap the parent": "mv /run /run.old",
}


@pytest.fixture(params=SERVER_BACKENDS)
def open_turn(request: pytest.FixtureRequest) -> Iterator[OpenTurn]:
    """Open turns of the backend with a writable root and an allow-list naming one host."""
    executors: list[Executor] = []

    def start(*, root_identity: bool = True) -> Turn:
        executor = Executor(
            Registry(),
            sandbox=get_backend(request.param),
            limits=LIMITS,
            timeout_seconds=30.0,
            writable_root=True,
            root_identity=root_identity,
            network_allow=["listed.test:80"],
        )
        executors.append(executor)
        return executor.turn()

    try:
        yield start
    finally:
        for executor in executors:
            executor.close()


def _fetch(turn: Turn) -> dict[str, object]:
    result = turn.exec(["python3", "-c", FETCH], timeout=30)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.decode().strip().splitlines()[-1]))


def _relay_answers(turn: Turn) -> None:
    reply = _fetch(turn)
    assert reply["status"] == 403, reply
    assert "not on this turn's network allow-list" in str(reply["body"])


def test_adduser_works_beside_the_egress_socket(open_turn: OpenTurn):
    """adduser as root takes its lock under /run and succeeds, and the relay still answers."""
    turn = open_turn()
    added = turn.exec(["adduser", "--comment", "run", "--disabled-password", "avrun"], timeout=60)
    assert added.returncode == 0, added.stderr
    assert turn.exec(["whoami"], user="avrun").stdout == b"avrun\n"
    _relay_answers(turn)


@pytest.mark.parametrize("root_identity", [False, True], ids=["nobody", "root"])
def test_run_is_writable_and_kept_across_calls(open_turn: OpenTurn, root_identity: bool):
    """A call creates a folder and a file under /run, and the next call finds them."""
    turn = open_turn(root_identity=root_identity)
    made = turn.exec(["sh", "-c", "mkdir -p /run/lock/mine && echo kept > /run/mine.pid"])
    assert made.returncode == 0, made.stderr
    assert turn.exec(["cat", "/run/mine.pid"]).stdout == b"kept\n"
    assert turn.exec(["test", "-d", "/run/lock/mine"]).returncode == 0


@pytest.mark.parametrize("root_identity", [False, True], ids=["nobody", "root"])
def test_no_call_can_take_the_egress_folders_place(open_turn: OpenTurn, root_identity: bool):
    """Writing in, removing, renaming, covering or moving away /run/egress all fail, and the
    relay still reaches the host's proxy afterwards."""
    turn = open_turn(root_identity=root_identity)
    before = turn.exec(["ls", "/run/egress"]).stdout
    for name, step in ATTACKS.items():
        attempt = turn.exec(["sh", "-c", step])
        assert attempt.returncode != 0, (name, attempt.stdout, attempt.stderr)
    assert turn.exec(["ls", "/run/egress"]).stdout == before
    _relay_answers(turn)
