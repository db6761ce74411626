"""Executor and Turn against a real sandbox: dispatch, refusals and the result rules."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from astralvessel import (
    Agent,
    Executor,
    Registry,
    Scope,
    ToolSpec,
    TurnClosedError,
    UsageError,
)
from astralvessel.sandbox import Sandbox

from ..conftest import MakeAgent

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "field-guide"
SAMPLE = ROOT / "examples" / "sample-data"


@pytest.fixture(scope="module")
def backend() -> Sandbox:
    """The default confined backend of this host (bubblewrap in CI): the real thing."""
    from astralvessel.sandbox import Bubblewrap

    return Bubblewrap()


@pytest.fixture
def example(backend: Sandbox) -> Executor:
    registry = Registry.for_agent(Agent.load(EXAMPLE))
    return Executor(registry, sandbox=backend, mounts={"/data": SAMPLE})


def py_tool(name: str, code: str, **kw: object) -> ToolSpec:
    return ToolSpec.command_tool(
        name,
        f"Test tool {name}.",
        ["python3", "-c", textwrap.dedent(code)],
        **kw,  # type: ignore[arg-type]
    )


def executor_for(backend: Sandbox, *tools: ToolSpec, **kw: object) -> Executor:
    return Executor(Registry(tools), sandbox=backend, **kw)  # type: ignore[arg-type]


def test_species_rivers_in_a_sandbox(example: Executor) -> None:
    """The example's species tool filters the sample pages by habitat, reading JSON on stdin."""
    with example.turn() as turn:
        result = turn.call("species", '{"habitat": "rivers"}')
    assert not result.is_error, result.text
    rows = json.loads(result.text)
    assert {r["page"] for r in rows} == {
        "beaver.md",
        "eel.md",
        "grayling.md",
        "grey-heron.md",
        "kingfisher.md",
        "otter.md",
        "salmon.md",
        "dipper.md",
        "water-vole.md",
    }
    assert result.exit_code == 0
    assert result.backend == "bubblewrap"
    assert result.policy_id == example.policy.identity


def test_args_mode_tool(example: Executor) -> None:
    """The args-mode example receives --path=value and prints its count."""
    with example.turn() as turn:
        result = turn.call("word_count", {"path": "species/otter.md"})
    assert result.text == "species/otter.md: 39 words\n"


def test_args_values_are_single_argv_elements(backend: Sandbox) -> None:
    """Hostile values stay inside one --name=value element: no shell, no extra flags."""
    tool = py_tool(
        "argv",
        "import sys, json; print(json.dumps(sys.argv[1:]))",
        input="args",
        parameters={
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": "boolean"},
                "c": {"type": "array"},
            },
        },
    )
    with executor_for(backend, tool).turn() as turn:
        result = turn.call("argv", {"c": ["x", "y"], "a": "v; rm -rf / $(id) --evil", "b": False})
    assert json.loads(result.text) == [
        "--a=v; rm -rf / $(id) --evil",
        "--b=False",
        "--c=['x', 'y']",
    ]


def test_json_stdin_receives_the_object(backend: Sandbox) -> None:
    """json-stdin tools get exactly the model's object on stdin."""
    tool = py_tool("echo", "import sys; print(sys.stdin.read())")
    with executor_for(backend, tool).turn() as turn:
        result = turn.call("echo", '{"q": "ünïcode", "n": [1, 2]}')
    assert json.loads(result.text) == {"q": "ünïcode", "n": [1, 2]}


def test_refusals_run_nothing(backend: Sandbox, tmp_path: Path) -> None:
    """Bad JSON, non-objects, schema failures and unknown args-mode names never start the command."""
    marker = tmp_path / "ran"
    tmp_path.chmod(0o777)  # a writable mount must be writable by the sandbox's user too
    tool = py_tool(
        "mark",
        "open('/out/ran', 'a').write('x')",
        input="args",
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    executor = executor_for(backend, tool, mounts={"/out": f"{tmp_path}:rw"})
    with executor.turn() as turn:
        for arguments in ['{"n": ', "[1]", '{"n": "one"}', '{"n": 1, "m": 2}']:
            result = turn.call("mark", arguments)
            assert result.is_error
            assert result.exit_code is None
        assert not marker.exists()
        assert not turn.call("mark", {"n": 1}).is_error
    assert marker.read_text() == "x"


def test_unknown_tool_lists_the_callable_ones(example: Executor) -> None:
    """A call to a tool that does not exist lists the tools the model may call."""
    with example.turn() as turn:
        result = turn.call("rm", "{}")
    assert result.is_error
    assert result.text == (
        "Error: there is no tool named 'rm'. The tools you can call are: "
        "read, grep, glob, list, species, word_count."
    )


def test_misspelt_tool_is_answered_with_the_closest_names(example: Executor) -> None:
    """A call to a misspelt tool names the closest tools first, then every tool."""
    with example.turn() as turn:
        result = turn.call("speceis", "{}")
    assert result.is_error
    assert result.text == (
        "Error: there is no tool named 'speceis'. Did you mean species? The tools you can "
        "call are: read, grep, glob, list, species, word_count."
    )


def test_tool_outside_granted_scopes_is_refused(backend: Sandbox) -> None:
    """A tool outside the executor's scopes is refused as if absent, and absent from the list."""
    registry = Registry.for_agent(Agent.load(EXAMPLE))
    executor = Executor(registry, sandbox=backend, mounts={"/data": SAMPLE}, scopes=[Scope.FILES])
    with executor.turn() as turn:
        result = turn.call("species", "{}")
    assert result.is_error
    assert result.text.endswith("The tools you can call are: read, glob, list.")


def test_vessel_scopes_are_the_default(make_agent: MakeAgent, backend: Sandbox) -> None:
    """Without scopes from the host, vessel.toml's scopes apply."""
    folder = make_agent(
        'scopes = ["tools:files"]\n[tools]\nbuiltin = ["list", "bash"]\n',
    )
    executor = Executor(Registry.for_agent(Agent.load(folder)), sandbox=backend)
    assert executor.tool_names() == ["list"]


def test_empty_output_shows_exit_code(backend: Sandbox) -> None:
    """A command that prints nothing shows the model `[exit code N]`; non-zero is an error."""
    ok = py_tool("ok", "pass")
    bad = py_tool("bad", "raise SystemExit(3)")
    with executor_for(backend, ok, bad).turn() as turn:
        first, second = turn.call("ok"), turn.call("bad")
    assert (first.text, first.is_error, first.exit_code) == ("[exit code 0]", False, 0)
    assert (second.text, second.is_error, second.exit_code) == ("[exit code 3]", True, 3)


def test_stdout_and_stderr_are_combined_in_order(backend: Sandbox) -> None:
    """Standard output and standard error arrive interleaved as written."""
    tool = py_tool(
        "mix",
        """
        import sys
        for i in range(3):
            print(f"out{i}", flush=True)
            print(f"err{i}", file=sys.stderr, flush=True)
        sys.exit(1)
        """,
    )
    with executor_for(backend, tool).turn() as turn:
        result = turn.call("mix")
    assert result.text == "out0\nerr0\nout1\nerr1\nout2\nerr2\n"
    assert result.is_error


def test_timeout_keeps_output_and_says_so(backend: Sandbox) -> None:
    """A call past its time limit is killed, keeps its output and ends with the timeout note."""
    tool = py_tool(
        "slow", "import time; print('started', flush=True); time.sleep(60)", timeout_seconds=1
    )
    with executor_for(backend, tool).turn() as turn:
        result = turn.call("slow")
    assert result.text == "started\n[timed out after 1 s]"
    assert result.timed_out
    assert result.is_error


def test_agent_timeout_applies_when_tool_has_none(make_agent: MakeAgent, backend: Sandbox) -> None:
    """tool_timeout_seconds is the limit of a tool that sets none."""
    folder = make_agent(
        'tool_timeout_seconds = 0.5\n[tools]\ndeclared = ["t.toml"]\n',
        {"t.toml": 'name = "t"\ndescription = "d"\ncommand = ["sleep", "30"]\n'},
    )
    with Executor(Registry.for_agent(Agent.load(folder)), sandbox=backend).turn() as turn:
        result = turn.call("t")
    assert result.text == "[timed out after 0.5 s]"


def test_output_is_cut_at_the_cap_with_a_count(backend: Sandbox) -> None:
    """Output beyond the cap is cut, and the note names exactly how many characters were dropped."""
    tool = py_tool("big", "print('é' * 50000)")
    with executor_for(backend, tool, output_chars=1000).turn() as turn:
        result = turn.call("big")
    assert result.dropped_chars == 50001 - 1000
    assert result.text == "é" * 1000 + "\n[output truncated: 49001 more characters were dropped]"


#: What the flooding tool prints: far past what the host may hold (the 8 MiB heap bound below).
FLOOD_BYTES = 100 << 20


def test_huge_output_keeps_host_memory_bounded(backend: Sandbox) -> None:
    """A tool printing 100 MiB leaves the host holding no more than a small bound of it."""
    flood = ToolSpec.command_tool(
        "flood", "Print a lot.", ["sh", "-c", f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' 'y'"]
    )
    warm = ToolSpec.command_tool("warm", "Print a little.", ["echo", "warm"])
    executor = executor_for(backend, flood, warm, output_chars=30_000)
    with executor.turn() as turn:
        turn.call("warm")  # start the sandbox first, so its start is not measured
        tracemalloc.start()
        try:
            result = turn.call("flood")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert result.dropped_chars == FLOOD_BYTES - 30_000
    assert len(result.text) < 31_000
    # The host's Python heap peak during the call: a few copies of the 30,000-character
    # cap plus buffers, never anything near the 100 MiB the tool printed.
    assert peak < 8 * 1024 * 1024, peak


def test_workspace_lives_for_the_turn(backend: Sandbox) -> None:
    """A later call of the same turn reads what an earlier one wrote; the next turn starts empty."""
    write = ToolSpec.command_tool("write", "w", ["sh", "-c", "echo kept > $HOME/note"])
    read = ToolSpec.command_tool("read_note", "r", ["sh", "-c", "cat $TMPDIR/note"])
    executor = executor_for(backend, write, read)
    with executor.turn() as turn:
        turn.call("write")
        assert turn.call("read_note").text == "kept\n"
    with executor.turn() as turn:
        assert turn.call("read_note").is_error


def test_outbox_files_come_back(backend: Sandbox) -> None:
    """Files a call leaves in $VESSEL_OUTBOX are returned with name and size, and outlive the turn."""
    tool = ToolSpec.command_tool("report", "r", ["sh", "-c", "printf hello > $VESSEL_OUTBOX/r.txt"])
    with executor_for(backend, tool).turn() as turn:
        result = turn.call("report")
        (file,) = result.files
        assert (file.name, file.size) == ("r.txt", 5)
        assert Path(file.path).read_bytes() == b"hello"
    assert Path(file.path).read_bytes() == b"hello"


async def test_async_calls_run_concurrently(backend: Sandbox) -> None:
    """Calls of one turn overlap: each waits until all four have started, which serial calls never would."""
    tool = py_tool(
        "meet",
        """
        import json, os, sys, time
        i = json.load(sys.stdin)["i"]
        home = os.environ["HOME"]
        open(os.path.join(home, f"arrived-{i}"), "w").close()
        deadline = time.monotonic() + 20
        met = False
        while not met and time.monotonic() < deadline:
            met = sum(n.startswith("arrived-") for n in os.listdir(home)) == 4
            time.sleep(0.01)
        print(json.dumps({"i": i, "met": met}))
        """,
        timeout_seconds=30,
    )
    async with executor_for(backend, tool).turn() as turn:
        results = await asyncio.gather(*(turn.acall("meet", {"i": i}) for i in range(4)))
    assert [json.loads(r.text) for r in results] == [{"i": i, "met": True} for i in range(4)]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def kill_server(session: object, sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or ``sig``) the turn's sandbox server, found on the host as our descendant by
    its inner pid.

    A call's own processes may bear the same inner pid in their nested namespace; the
    server is the match in the fewest namespaces.
    """
    inner = str(session.ready_info["pid"])  # type: ignore[attr-defined]
    matches = []
    for pid in _descendants(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if len(nspid) > 1 and nspid[-1] == inner:
            matches.append((len(nspid), pid))
    assert matches, "the sandbox server was not found"
    os.kill(min(matches)[1], sig)


def test_dead_sandbox_costs_one_call_not_the_turn(backend: Sandbox) -> None:
    """A call whose sandbox dies gets one error saying the workspace is lost; the next starts fresh."""
    registry = Registry()
    registry.add_builtin("bash")
    with Executor(registry, sandbox=backend).turn() as turn:
        assert not turn.call("bash", {"command": "echo kept > $HOME/note"}).is_error
        first = turn.session
        kill_server(first)
        died = turn.call("bash", {"command": "cat $HOME/note"})
        after = turn.call("bash", {"command": "cat $HOME/note; echo fresh"})
        assert turn.session is not first
    assert died.is_error
    assert "the sandbox died" in died.text
    assert "is lost" in died.text
    assert died.backend == "bubblewrap"
    assert after.text.endswith("fresh\n[exit code 0]")
    assert "kept" not in after.text


async def test_dead_sandbox_fails_the_call_in_flight(backend: Sandbox) -> None:
    """A call waiting in a sandbox that dies gets the dead-sandbox error, not an exception."""
    registry = Registry()
    registry.add_builtin("bash")
    async with Executor(registry, sandbox=backend, timeout_seconds=60).turn() as turn:
        session = turn.session
        waiting = asyncio.create_task(turn.acall("bash", {"command": "sleep 50"}))
        await asyncio.sleep(0.2)  # lets the call reach the sandbox (or not: both must hold)
        kill_server(session)
        died = await waiting
        again = await turn.acall("bash", {"command": "echo alive"})
    assert died.is_error
    assert "the sandbox died" in died.text
    assert again.text == "alive\n[exit code 0]"


def test_closed_turn_refuses_new_calls(backend: Sandbox) -> None:
    """A turn that has ended says so instead of starting a new sandbox."""
    tool = py_tool("ok", "pass")
    turn = executor_for(backend, tool).turn()
    with turn:
        turn.call("ok")
    with pytest.raises(TurnClosedError, match="this turn has ended") as info:
        turn.call("ok")
    assert isinstance(info.value, RuntimeError)


def test_builtins_through_the_executor(example: Executor) -> None:
    """read, list, glob and grep work on mounted data through Turn.call, in the sandbox's view."""
    with example.turn() as turn:
        listing = turn.call("list", {"path": "species"})
        page = turn.call("read", {"path": "/data/species/otter.md", "limit": 3})
        found = turn.call("glob", {"pattern": "*.md"})
        matches = turn.call("grep", {"pattern": "spraints", "path": "/data"})
    assert not listing.is_error, listing.text
    assert "otter.md" in listing.text
    assert page.text.startswith("1\t---\n2\tname: Eurasian otter\n3\tfamily: Mustelidae\n")
    assert found.text.count(".md") == 12
    assert matches.text.startswith("/data/species/otter.md:")
    assert matches.is_error is False


def test_bash_builtin_shows_exit_code(backend: Sandbox) -> None:
    """bash runs /bin/sh -c in the workdir and always ends with [exit code N]."""
    registry = Registry()
    registry.add_builtin("bash")
    with Executor(registry, sandbox=backend).turn() as turn:
        ok = turn.call("bash", {"command": "pwd; echo $HOME"})
        bad = turn.call("bash", {"command": "exit 4"})
    assert ok.text == "/workspace\n/workspace\n[exit code 0]"
    assert (bad.text, bad.is_error) == ("[exit code 4]", True)


def test_dict_mounts_accept_ro_and_rw(backend: Sandbox, tmp_path: Path) -> None:
    """The dict form of mounts takes a host path with an optional :ro or :rw suffix."""
    executor = executor_for(
        backend, mounts={"/data": f"{tmp_path}:ro", "/out": f"{tmp_path}:rw", "/x": tmp_path}
    )
    assert [(str(m.target), m.writable) for m in executor.policy.mounts] == [
        ("/data", False),
        ("/out", True),
        ("/x", False),
    ]


def test_results_of_host_and_sandbox_calls_are_stamped_alike(backend: Sandbox) -> None:
    """Every result names its tool and duration; backend and policy_id mark sandboxed calls."""
    registry = Registry([py_tool("hello", "print('hi')")])

    @registry.tool
    def answer() -> str:
        """Answer in the host."""
        return "42"

    executor = Executor(registry, sandbox=backend)
    with executor.turn() as turn:
        confined, host, refused = turn.call("hello"), turn.call("answer"), turn.call("nope")
    assert (confined.backend, confined.policy_id) == ("bubblewrap", executor.policy.identity)
    assert (host.backend, host.policy_id, host.text) == (None, None, "42")
    assert (refused.backend, refused.tool, refused.is_error) == (None, "nope", True)
    assert all(r.duration > 0 for r in (confined, host, refused))


def test_unknown_dialect_is_a_usage_error() -> None:
    """Asking for schemas in an unknown dialect raises UsageError, also a ValueError."""
    with pytest.raises(UsageError, match="unknown dialect") as info:
        Registry().schemas("gemini")  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
