"""The good path: what a well-behaved call can count on, on every backend."""

from __future__ import annotations

import concurrent.futures

from astralvessel.sandbox import Policy, Sandbox
from astralvessel.sandbox.docker._exec_session import ExecSession

from .calls import file_tool, py, py_json, run


def test_cwd_is_the_workdir(session):
    """A call starts in the policy's workdir, where the host's data is mounted."""
    outcome = run(session, "/bin/sh", "-c", "pwd; cat species.txt")
    assert outcome.output.splitlines() == ["/data", "otter", "heron"]


def test_agent_folder_is_at_agent(session):
    """The agent folder is readable at /agent (what ``{package}`` names)."""
    outcome = run(session, "/usr/bin/python3", "/agent/tools/hello.py")
    assert outcome.exit_code == 0
    assert outcome.output == "hello from the agent folder\n"


def test_stdin_reaches_the_call(session):
    """The request's stdin bytes arrive on the call's standard input."""
    outcome = py(
        session,
        "import sys, json; print(json.load(sys.stdin)['habitat'])",
        stdin=b'{"habitat": "rivers"}',
    )
    assert outcome.output == "rivers\n"


def test_exit_code_and_combined_output(session):
    """Exit status comes back, with stdout and stderr combined."""
    outcome = run(session, "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
    assert outcome.exit_code == 3
    assert sorted(outcome.output.splitlines()) == ["err", "out"]


def test_outbox_files_come_back(session):
    """Files a call leaves in $VESSEL_OUTBOX come back to the host with their content."""
    outcome = run(session, "/bin/sh", "-c", 'printf "a,b\\n1,2\\n" > "$VESSEL_OUTBOX/table.csv"')
    assert outcome.exit_code == 0, outcome.output
    assert [(f.name, f.size) for f in outcome.files] == [("table.csv", 8)]
    assert outcome.files[0].path.read_text() == "a,b\n1,2\n"


def test_workspace_persists_within_a_turn(session):
    """A later call of the same turn reads what an earlier one wrote to the workspace."""
    assert run(session, "/bin/sh", "-c", "echo kept > $HOME/note.txt").exit_code == 0
    assert run(session, "cat", "/workspace/note.txt").output == "kept\n"


def test_next_turn_starts_empty(backend: Sandbox, policy: Policy):
    """A new turn's workspace is empty: nothing of the previous turn is left."""
    first = backend.start(policy)
    try:
        assert run(first, "/bin/sh", "-c", "echo old > /workspace/left.txt").exit_code == 0
    finally:
        first.close()
    second = backend.start(policy)
    try:
        listing = py_json(
            second, "import json, os; print(json.dumps(sorted(os.listdir('/workspace'))))"
        )
    finally:
        second.close()
    assert listing == ["outbox"]


def test_output_is_bounded(session):
    """A call printing far more than ``output_chars`` comes back cut, with the rest counted."""
    outcome = py(session, "import sys; sys.stdout.write('x' * 2_000_000)", output_chars=1000)
    assert len(outcome.output) <= 1000
    assert outcome.dropped_chars >= 2_000_000 - 1000


def test_concurrent_calls(session):
    """Several calls of one turn run at the same time and each gets its own result."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = [
            pool.submit(run, session, "/bin/sh", "-c", f"sleep 0.2; echo {n}") for n in range(4)
        ]
        outputs = [f.result().output.strip() for f in futures]
    assert outputs == ["0", "1", "2", "3"]


def test_a_call_that_closed_its_output_takes_none_of_the_next_calls(session):
    """Calls after one that closed its stdout and goes on running each get their own output."""
    # It waits for the others (15 s at most). Where calls run one at a time (docker-exec)
    # none can run beside it, so it waits a moment only and the others run after it.
    waits = 20 if isinstance(session, ExecSession) else 300
    quiet_script = (
        "exec >/dev/null 2>&1; touch /workspace/quiet.started; "
        f"for _ in $(seq {waits}); do [ -e /workspace/quiet.done ] && break; sleep 0.05; done"
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        quiet = pool.submit(run, session, "/bin/sh", "-c", quiet_script, timeout=60)
        started = "until [ -e /workspace/quiet.started ]; do sleep 0.05; done"
        assert run(session, "/bin/sh", "-c", started, timeout=60).exit_code == 0
        # Each of these runs after the quiet call's output pipe was closed: a later pipe may
        # take its number, and its output must still go to its own call.
        outputs = [run(session, "/bin/echo", f"loud {n}").output for n in range(6)]
        run(session, "/bin/sh", "-c", "touch /workspace/quiet.done")
        quiet_outcome = quiet.result()
    assert outputs == [f"loud {n}\n" for n in range(6)]
    assert quiet_outcome.exit_code == 0
    assert quiet_outcome.output == ""


def test_file_tools_see_the_sandbox_view(session):
    """read, list and glob answer from the sandbox's own view of the filesystem."""
    read = file_tool(session, "read", {"path": "/data/species.txt"}, timeout=10)
    assert not read.is_error
    assert "otter" in read.text
    listing = file_tool(session, "list", {"path": "/agent"}, timeout=10)
    assert "vessel.toml" in listing.text
    found = file_tool(session, "glob", {"pattern": "tools/*.py", "path": "/agent"}, timeout=10)
    assert "hello.py" in found.text


def test_file_tools_cannot_read_host_files(session):
    """A file tool asked for a host path outside the sandbox view answers with an error."""
    outcome = file_tool(session, "read", {"path": "/etc/shadow"}, timeout=10)
    assert outcome.is_error
    assert "root:" not in outcome.text


def test_missing_command_is_a_normal_result(session):
    """Running a command that does not exist is a failed call, not a dead sandbox."""
    outcome = run(session, "no-such-command-here")
    assert outcome.exit_code == 127
    assert run(session, "true").exit_code == 0
