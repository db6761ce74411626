"""The built-ins end to end in a real bubblewrap sandbox, as the sandbox's unprivileged user."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.builtins import bash_request, grep_request
from astralvessel.results import grep_text, render_command
from astralvessel.sandbox import Bubblewrap, Mount, Policy, RunRequest, SandboxSession
from tests.conformance.calls import file_tool

from .conftest import CANARY


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host folder with data to mount at /data, and a canary beside it."""
    base = tmp_path_factory.mktemp("e2e")
    base.chmod(0o755)
    data = base / "data"
    (data / "notes").mkdir(parents=True)
    (data / "notes" / "a.md").write_text("hello sandbox\n")
    (data / "notes" / "b.md").write_text("second\n")
    (base / "canary.txt").write_text(CANARY + "\n")
    (data / "host-link").symlink_to(base / "canary.txt")
    (data / "proc-link").symlink_to("/proc/self/root/etc/hostname")
    os.mkfifo(data / "pipe")
    for path in [base, *base.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return base


@pytest.fixture(scope="module")
def session(host: Path) -> Iterator[SandboxSession]:
    """One bubblewrap turn with the data mounted read-only at /data, the workdir."""
    policy = Policy(workdir="/data", mounts=[Mount.from_pair("/data", host / "data")])
    started = Bubblewrap().start(policy)
    yield started
    started.close()


def _grep(session: SandboxSession, engine: str, **arguments: object) -> tuple[str, bool]:
    argv, stdin = grep_request(
        arguments,
        workdir="/data",
        visible_roots=[str(r) for r in session.policy.visible_roots],
        engine=engine,  # type: ignore[arg-type]
    )
    outcome = session.run(RunRequest(argv=argv, stdin=stdin, timeout=20, output_chars=30_000))
    return grep_text(outcome.output, outcome.exit_code)


def _bash(session: SandboxSession, command: str) -> tuple[str, int | None]:
    argv, stdin = bash_request({"command": command})
    outcome = session.run(RunRequest(argv=argv, stdin=stdin, timeout=20, output_chars=30_000))
    shown = render_command(outcome, timeout=20, show_exit_code=True).text
    return shown, outcome.exit_code


def test_read_list_and_glob_in_the_sandbox(session: SandboxSession) -> None:
    """The file tools answer in the sandbox's view, with sandbox paths."""
    assert file_tool(session, "read", {"path": "notes/a.md"}, timeout=10).text == "1\thello sandbox"
    listing = file_tool(session, "list", {}, timeout=10)
    assert listing.text.splitlines()[0] == "notes/"
    found = file_tool(session, "glob", {"pattern": "*.md", "path": "/data"}, timeout=10)
    assert found.text == "/data/notes/a.md\n/data/notes/b.md"


@pytest.mark.parametrize("path", ["host-link", "proc-link", "/proc/self/root/etc/hostname", "/tmp"])
def test_escapes_are_refused_in_the_sandbox(session: SandboxSession, path: str) -> None:
    """A link to a host path, /proc/self/root and non-data folders are refused inside too."""
    outcome = file_tool(session, "read", {"path": path}, timeout=10)
    assert outcome.is_error
    assert CANARY not in outcome.text


def test_a_fifo_does_not_block_the_sandbox_worker(session: SandboxSession) -> None:
    """Reading a FIFO is refused at once, and the worker answers the next call."""
    assert file_tool(session, "read", {"path": "pipe"}, timeout=10).is_error
    assert not file_tool(session, "read", {"path": "notes/b.md"}, timeout=10).is_error


@pytest.mark.parametrize("engine", ["rg", "grep"])
def test_grep_in_the_sandbox_with_either_engine(session: SandboxSession, engine: str) -> None:
    """grep runs as a confined call and prints the same lines with rg or grep."""
    assert _grep(session, engine, pattern="hello") == ("notes/a.md:1:hello sandbox", False)
    text, is_error = _grep(session, engine, pattern="x", path="/proc/self")
    assert is_error
    assert "outside the agent's data" in text


def test_bash_in_the_sandbox(session: SandboxSession) -> None:
    """bash runs /bin/sh -c in the workdir and ends with the exit code."""
    assert _bash(session, "pwd; exit 3") == ("/data\n[exit code 3]", 3)


def test_a_hard_link_out_of_the_data_cannot_be_made(session: SandboxSession, host: Path) -> None:
    """From the sandbox, neither the host canary nor a data file can be hard-linked into the workspace."""
    canary = host / "canary.txt"
    text, _ = _bash(
        session,
        f"ln {canary} /workspace/c 2>/dev/null; echo canary=$?; "
        "ln /data/notes/a.md /workspace/a 2>/dev/null; echo data=$?",
    )
    assert "canary=0" not in text
    assert "data=0" not in text
    assert CANARY not in text
    assert file_tool(session, "read", {"path": "/workspace/c"}, timeout=10).is_error
