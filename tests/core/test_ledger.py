"""The turn ledger: what each record holds, where it goes, what the host redacts, and that a
host killed mid-turn leaves a readable ledger."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from astralvessel import Executor, Registry, UsageError
from astralvessel._ground._ledger import Ledger, read_ledger
from astralvessel.sandbox import Sandbox
from astralvessel.sandbox._discovery import get_backend

from .conftest import Cli

SRC = Path(__file__).parents[2] / "src"


@pytest.fixture(scope="module")
def backend() -> Sandbox:
    """The real bubblewrap backend."""
    return get_backend("bubblewrap")


def _bash() -> Registry:
    registry = Registry()
    registry.add_builtin("bash")
    return registry


def test_a_turn_writes_one_file_of_its_events(backend: Sandbox, tmp_path: Path) -> None:
    """In a folder, a turn's file holds its header, calls, exec, file operations and close."""
    executor = Executor(_bash(), sandbox=backend, ledger=tmp_path)
    with executor.turn() as turn:
        turn.call("bash", {"command": "echo hi; echo report > $VESSEL_OUTBOX/r.txt"})
        turn.call("bash", {"command": 5})
        turn.exec(["/bin/sh", "-c", "echo out; exit 2"])
        turn.write_file("n.txt", "abc")
    (path,) = tmp_path.iterdir()
    assert path.name == f"{turn.turn_id}.jsonl"
    records = list(read_ledger(path))
    assert [r["event"] for r in records] == [
        "turn",
        "sandbox",
        "call",
        "call",
        "exec",
        "file",
        "close",
    ]
    head, _, ran, refused, exec_record, write, close = records
    assert (head["schema"], head["turn"], head["backend"]) == (1, turn.turn_id, "bubblewrap")
    assert head["policy_id"] == executor.policy.identity
    assert ran["arguments"] == {"command": "echo hi; echo report > $VESSEL_OUTBOX/r.txt"}
    assert (ran["text"], ran["outcome"], ran["exit_code"]) == ("hi\n[exit code 0]", "ok", 0)
    assert ran["ran"]["output"] == "hi\n"
    (file,) = ran["files"]
    assert (file["name"], file["size"]) == ("r.txt", 7)
    assert file["sha256"] == hashlib.sha256(b"report\n").hexdigest()
    assert (refused["outcome"], refused["seq"], "ran" in refused) == ("refused", 2, False)
    assert (exec_record["returncode"], exec_record["stdout"], exec_record["outcome"]) == (
        2,
        "out\n",
        "failed",
    )
    assert (write["op"], write["path"], write["size"]) == ("write", "n.txt", 3)
    assert close["calls"] == 2


def test_a_file_target_holds_every_turn(backend: Sandbox, tmp_path: Path) -> None:
    """A file (not a folder) receives every turn's records, each turn's whole."""
    target = tmp_path / "all.jsonl"
    executor = Executor(_bash(), sandbox=backend, ledger=target)
    for _ in range(2):
        with executor.turn() as turn:
            turn.call("nope", {})
    heads = [r for r in read_ledger(target) if r["event"] == "turn"]
    assert len(heads) == 2
    assert heads[0]["turn"] != heads[1]["turn"]


def test_a_callable_gets_each_record(backend: Sandbox) -> None:
    """A callable target receives each record as a dict, in order."""
    seen: list[dict[str, Any]] = []
    with Executor(_bash(), sandbox=backend, ledger=seen.append).turn() as turn:
        turn.call("nope", {})
    assert [r["event"] for r in seen] == ["turn", "call", "close"]


def test_the_redaction_hook_sees_each_record_first(backend: Sandbox, tmp_path: Path) -> None:
    """The host's hook changes or drops records before any byte is written."""

    def redact(record: dict[str, Any]) -> dict[str, Any] | None:
        if record["event"] == "exec":
            return None
        return json.loads(json.dumps(record).replace("hunter2", "[redacted]"))

    ledger = Ledger(target=tmp_path, redact=redact)
    with Executor(_bash(), sandbox=backend, ledger=ledger).turn() as turn:
        turn.call("bash", {"command": "echo hunter2"})
        turn.exec(["/bin/echo", "hunter2"])
    (path,) = tmp_path.iterdir()
    text = path.read_text()
    assert "hunter2" not in text
    assert '"exec"' not in text
    assert "[redacted]" in text


def test_long_texts_are_cut_with_their_hash(backend: Sandbox, tmp_path: Path) -> None:
    """Arguments and texts past ``max_chars`` are cut, keeping their length and full sha256."""
    command = "printf '%0300d' 0"
    ledger = Ledger(target=tmp_path, max_chars=100)
    with Executor(_bash(), sandbox=backend, ledger=ledger).turn() as turn:
        result = turn.call("bash", {"command": command + "  " + " " * 200})
    (path,) = tmp_path.iterdir()
    call = next(r for r in read_ledger(path) if r["event"] == "call")
    assert call["text"]["$cut"] == result.text[:100]
    assert call["text"]["chars"] == len(result.text)
    assert call["text"]["sha256"] == hashlib.sha256(result.text.encode()).hexdigest()
    assert call["arguments"]["$cut"].startswith('{"command": "printf')


def test_a_wrong_ledger_is_the_hosts_error(tmp_path: Path) -> None:
    """A ledger that is not a path, callable or Ledger raises UsageError before any turn."""
    with pytest.raises(UsageError, match="ledger is a folder"):
        Executor(_bash(), sandbox="bubblewrap", ledger=42)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="max_chars"):
        Ledger(target=tmp_path, max_chars=0)


_KILLED_HOST = """
import sys, time
from astralvessel import Executor, Registry
registry = Registry(); registry.add_builtin("bash")
with Executor(registry, sandbox="bubblewrap", ledger=sys.argv[1]).turn() as turn:
    for n in range(3):
        turn.call("bash", {"command": f"echo {n}"})
    print("ready", flush=True)
    turn.call("bash", {"command": "sleep 60"})
"""


def test_a_host_killed_mid_turn_leaves_a_readable_ledger(tmp_path: Path) -> None:
    """SIGKILL mid-call leaves every record written before it whole and readable."""
    target = tmp_path / "killed.jsonl"
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_HOST, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    ) as host:
        try:
            assert host.stdout is not None
            assert host.stdout.readline() == "ready\n"
            time.sleep(0.2)  # the last call reaches the sandbox (or not: both must hold)
        finally:
            host.send_signal(signal.SIGKILL)
            host.wait(30)
    records = list(read_ledger(target))
    assert [r["event"] for r in records] == ["turn", "sandbox", "call", "call", "call"]
    assert [r["text"] for r in records[2:]] == [f"{n}\n[exit code 0]" for n in range(3)]


def test_ledger_show_prints_one_line_per_record(backend: Sandbox, tmp_path: Path, cli: Cli) -> None:
    """``astralvessel ledger show FILE`` reads a ledger back, one line per record."""
    with Executor(_bash(), sandbox=backend, ledger=tmp_path).turn() as turn:
        turn.call("bash", {"command": "echo \\x1b[31mred"})
    (path,) = tmp_path.iterdir()
    ran = cli("ledger", "show", str(path))
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"turn {turn.turn_id}  backend=bubblewrap")
    assert lines[2].startswith('  #1 bash {"command": "echo \\\\x1b[31mred"} -> ok')
    assert "\x1b" not in ran.stdout
    assert lines[-1].startswith("closed: 1 calls in ")


def test_a_turn_dropped_unclosed_still_closes_its_file(backend: Sandbox, tmp_path: Path) -> None:
    """A turn collected without close leaves its records on disk and its file closed."""
    executor = Executor(_bash(), sandbox=backend, ledger=tmp_path)
    turn = executor.turn()
    turn.call("nope", {})
    opened = len(os.listdir("/proc/self/fd"))
    del turn
    gc.collect()
    (path,) = tmp_path.iterdir()
    assert [r["event"] for r in read_ledger(path)] == ["turn", "call"]
    assert len(os.listdir("/proc/self/fd")) == opened - 1
