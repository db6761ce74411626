"""The library's log events: each one a host can see, and none that shows a call's contents."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from astralvessel import Executor, Registry
from astralvessel.sandbox import Sandbox
from astralvessel.sandbox._discovery import get_backend

from .test_executor import kill_server

SECRET = "otter-secret-4711"


@pytest.fixture(scope="module")
def backend() -> Sandbox:
    """The real bubblewrap backend."""
    return get_backend("bubblewrap")


def _events(caplog: pytest.LogCaptureFixture, logger: str) -> list[dict[str, object]]:
    return [r.astralvessel for r in caplog.records if r.name == logger]  # type: ignore[attr-defined]


def _bash() -> Registry:
    registry = Registry()
    registry.add_builtin("bash")
    return registry


def test_a_turn_logs_its_open_calls_commands_files_and_close(
    backend: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """Opened and closed (backend, policy, uid, timings), each call, exec and file operation."""
    caplog.set_level(logging.DEBUG, logger="astralvessel")
    with Executor(_bash(), sandbox=backend).turn() as turn:
        turn.call("bash", {"command": f"echo {SECRET}"})
        turn.exec(["/bin/echo", SECRET])
        turn.write_file("note.txt", SECRET)
        turn.read_file("note.txt")
        turn.list_dir(".")
    opened, closed = _events(caplog, "astralvessel.turn")
    assert (opened["event"], closed["event"]) == ("turn.opened", "turn.closed")
    assert opened["backend"] == "bubblewrap"
    assert opened["policy_id"] == closed["policy_id"]
    assert isinstance(opened["uid"], int)
    assert closed["calls"] == 1
    assert isinstance(closed["duration"], float)
    (call,) = _events(caplog, "astralvessel.calls")
    assert (call["tool"], call["outcome"], call["text_chars"]) == (
        "bash",
        "ok",
        len(f"{SECRET}\n[exit code 0]"),
    )
    assert [e["event"] for e in _events(caplog, "astralvessel.exec")] == [
        "exec",
        "file",
        "file",
        "file",
    ]
    exec_event, write, read, listing = _events(caplog, "astralvessel.exec")
    assert (exec_event["program"], exec_event["stdout_bytes"]) == ("echo", len(SECRET) + 1)
    assert (exec_event["outcome"], exec_event["returncode"]) == ("ok", 0)
    for timed in (call, exec_event, write, read, listing):
        assert isinstance(timed["duration"], float)
    assert (write["op"], write["size"], read["op"], read["size"]) == (
        "write",
        len(SECRET),
        "read",
        len(SECRET),
    )
    assert listing["op"] == "list"
    (started,) = _events(caplog, "astralvessel.sandbox")
    assert started["event"] == "sandbox.started"
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_refusals_are_logged_without_their_arguments(
    backend: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused call is logged on astralvessel.refusals by tool, never by its arguments."""
    caplog.set_level(logging.INFO, logger="astralvessel")
    with Executor(_bash(), sandbox=backend, scopes=["tools:read"]).turn() as turn:
        turn.call("bash", {"command": SECRET})
    (refused,) = _events(caplog, "astralvessel.refusals")
    assert (refused["event"], refused["tool"]) == ("call.refused", "bash")
    assert all(SECRET not in r.getMessage() for r in caplog.records)


def test_argument_and_unknown_tool_refusals_are_logged(
    backend: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """Arguments the schema refuses and a tool that does not exist are refusals too, each
    also a call whose outcome is ``refused``."""
    caplog.set_level(logging.INFO, logger="astralvessel")
    with Executor(_bash(), sandbox=backend).turn() as turn:
        turn.call("bash", {"command": 5, "secret": SECRET})
        turn.call(SECRET, {})
    refused = _events(caplog, "astralvessel.refusals")
    assert [(e["event"], e["tool"]) for e in refused] == [
        ("call.refused", "bash"),
        ("call.refused", SECRET),
    ]
    calls = _events(caplog, "astralvessel.calls")
    assert [e["outcome"] for e in calls] == ["refused", "refused"]


def test_each_connection_the_proxy_refused_is_logged(
    backend: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection the turn's egress proxy refused is logged with its host, port and why."""
    caplog.set_level(logging.INFO, logger="astralvessel.network")
    fetch = (
        'python3 -c "import urllib.request as u\n'
        "try: u.urlopen('http://not-listed.test:8080/', timeout=20)\n"
        'except Exception as e: print(e)"'
    )
    with Executor(_bash(), sandbox=backend, network_allow=["pypi.org"]).turn() as turn:
        turn.call("bash", {"command": fetch})
    (refused,) = _events(caplog, "astralvessel.network")
    assert (refused["event"], refused["host"], refused["port"]) == (
        "proxy.refused",
        "not-listed.test",
        8080,
    )
    assert "not on this turn's network allow-list" in str(refused["reason"])


def test_a_sandbox_death_and_restart_are_logged(
    backend: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox that died is a WARNING naming why; the fresh one's start follows."""
    caplog.set_level(logging.INFO, logger="astralvessel")
    with Executor(_bash(), sandbox=backend).turn() as turn:
        turn.call("bash", {"command": "true"})
        kill_server(turn.session)
        turn.call("bash", {"command": "true"})
        turn.call("bash", {"command": "true"})
    events = [
        (r.levelno, r.astralvessel["event"])
        for r in caplog.records
        if r.name == "astralvessel.sandbox"
    ]  # type: ignore[attr-defined]
    assert events == [
        (logging.INFO, "sandbox.started"),
        (logging.WARNING, "sandbox.lost"),
        (logging.INFO, "sandbox.started"),
    ]


def test_warm_pool_refills_are_logged(backend: Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    """Each sandbox the warm pool starts ahead is logged with how many are ready."""
    caplog.set_level(logging.INFO, logger="astralvessel.warm")
    with Executor(_bash(), sandbox=backend, warm=1) as executor:
        assert executor.wait_warm(60)
    (refill, *_) = _events(caplog, "astralvessel.warm")
    assert (refill["event"], refill["backend"], refill["ready"], refill["size"]) == (
        "warm.refilled",
        "bubblewrap",
        1,
        1,
    )


def test_the_library_prints_nothing_unless_the_host_configures_logging() -> None:
    """Without logging configured, a turn whose sandbox dies writes nothing to stderr."""
    code = (
        "from astralvessel import Executor, Registry\n"
        "r = Registry(); r.add_builtin('bash')\n"
        "with Executor(r, sandbox='bubblewrap').turn() as t:\n"
        "    t.call('bash', {'command': 'true'}); t.call('nope', {})\n"
        "    t._discard(t.session, 'gone')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stderr == ""
