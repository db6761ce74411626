"""FakeSandbox: what it records, how it answers, and where it refuses to guess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astralvessel import (
    Agent,
    ExecResult,
    Executor,
    Registry,
    SandboxError,
    SandboxPermissionError,
    ToolSpec,
    UsageError,
)
from astralvessel.testing import FakeCall, FakeExec, FakeRun, FakeSandbox, UnscriptedCallError

ROOT = Path(__file__).parents[2]
FIELD_GUIDE = ROOT / "examples" / "field-guide"


def field_guide(fake: FakeSandbox) -> Executor:
    return Executor(Registry.for_agent(Agent.load(FIELD_GUIDE)), sandbox=fake)


def test_records_what_the_sandbox_would_receive() -> None:
    """A declared json-stdin tool is recorded with its name, arguments, argv and stdin."""
    fake = FakeSandbox(tools={"species": "[]"})
    with field_guide(fake).turn() as turn:
        result = turn.call("species", '{"habitat": "rivers"}')
    assert (result.text, result.backend) == ("[]", "fake")
    assert fake.calls == [
        FakeCall(
            tool="species",
            arguments={"habitat": "rivers"},
            argv=("python3", "/agent/tools/species.py"),
            stdin=b'{"habitat": "rivers"}',
            timeout=20.0,
        )
    ]


def test_args_mode_arguments_are_recorded_as_the_command_got_them() -> None:
    """An ``input = "args"`` tool's arguments are its ``--name=value`` flags, as text."""
    fake = FakeSandbox(tools={"word_count": lambda call: f"{call.arguments['path']}: 12 words"})
    with field_guide(fake).turn() as turn:
        result = turn.call("word_count", {"path": "species/otter.md"})
    (call,) = fake.calls_to("word_count")
    assert call.argv[-1] == "--path=species/otter.md"
    assert call.arguments == {"path": "species/otter.md"}
    assert result.text == "species/otter.md: 12 words"


def test_a_function_answer_sees_the_call() -> None:
    """A function answer receives the recorded call and may return a FakeRun."""
    fake = FakeSandbox(
        tools={
            "species": lambda call: FakeRun(output=json.dumps(dict(call.arguments)), exit_code=1)
        }
    )
    with field_guide(fake).turn() as turn:
        result = turn.call("species", {"habitat": "rivers"})
    assert (result.text, result.is_error, result.exit_code) == ('{"habitat": "rivers"}', True, 1)


def test_unscripted_call_fails_the_test() -> None:
    """A call the script does not answer raises UnscriptedCallError, also a LookupError."""
    fake = FakeSandbox()
    with field_guide(fake).turn() as turn, pytest.raises(LookupError, match="species"):
        turn.call("species", {})
    assert isinstance(UnscriptedCallError("x"), LookupError)


def test_default_answers_the_rest() -> None:
    """``default`` answers any confined call the script does not name."""
    registry = Registry()
    registry.add_builtin("bash")
    fake = FakeSandbox(
        bash={"ls": "a\n"}, default=FakeRun(output="sh: 1: nope: not found\n", exit_code=127)
    )
    with Executor(registry, sandbox=fake).turn() as turn:
        listed, missing = (
            turn.call("bash", {"command": "ls"}),
            turn.call("bash", {"command": "nope"}),
        )
    assert listed.text == "a\n[exit code 0]"
    assert missing.text == "sh: 1: nope: not found\n[exit code 127]"
    assert [c.arguments["command"] for c in fake.calls_to("bash")] == ["ls", "nope"]


def test_grep_arguments_are_read_back_from_its_script() -> None:
    """A grep call is recorded as grep with the arguments the model gave."""
    registry = Registry()
    registry.add_builtin("grep")
    fake = FakeSandbox(tools={"grep": "notes.md:1:otter\n"})
    with Executor(registry, sandbox=fake).turn() as turn:
        result = turn.call("grep", {"pattern": "otter", "glob": "*.md", "ignore_case": True})
    assert result.text == "notes.md:1:otter"
    assert fake.calls[0].arguments == {
        "pattern": "otter",
        "glob": "*.md",
        "ignore_case": True,
        "max_results": 100,
    }


def test_in_memory_files_are_read_as_in_a_sandbox() -> None:
    """``files`` are served by the sandbox server's own read, list and glob."""
    registry = Registry()
    for name in ("read", "list", "glob"):
        registry.add_builtin(name)
    fake = FakeSandbox(
        files={"/workspace/notes/a.md": "one\ntwo\n", "/workspace/b.txt": b"\x00bin"}
    )
    with Executor(registry, sandbox=fake).turn() as turn:
        page = turn.call("read", {"path": "notes/a.md"})
        listing = turn.call("list", {})
        binary = turn.call("read", {"path": "b.txt"})
        system = turn.call("list", {"path": "/etc"})
    assert page.text == "1\tone\n2\ttwo"
    assert listing.text == "notes/\noutbox/\nb.txt"
    assert binary.is_error
    assert (system.text, system.is_error) == (
        "[/etc is empty]",
        False,
    )  # the host's /etc is never shown


def test_file_outside_the_sandbox_view_is_the_hosts_mistake() -> None:
    """A fake file under no visible root raises UsageError when the turn starts."""
    registry = Registry()
    registry.add_builtin("read")
    fake = FakeSandbox(files={"/elsewhere/a.txt": "x"})
    with (
        Executor(registry, sandbox=fake).turn() as turn,
        pytest.raises(UsageError, match="/elsewhere"),
    ):
        turn.call("read", {"path": "/elsewhere/a.txt"})


def test_a_raised_sandbox_error_is_a_dead_sandbox() -> None:
    """An answer that raises SandboxError costs that call, as a dying sandbox does."""

    def die(call: FakeCall) -> str:
        raise SandboxError("the fake sandbox was told to die")

    tools = [ToolSpec.command_tool("die", "d", ["die"]), ToolSpec.command_tool("ok", "o", ["ok"])]
    fake = FakeSandbox(tools={"die": die, "ok": "fine"}, registry=tools)
    with Executor(Registry(tools), sandbox=fake).turn() as turn:
        died, after = turn.call("die"), turn.call("ok")
        assert fake.open_sessions == 1
    assert died.is_error
    assert "sandbox died" in died.text
    assert after.text == "fine"
    assert fake.open_sessions == 0


async def test_async_calls_answer_alike() -> None:
    """acall goes through the same fake session as call."""
    fake = FakeSandbox(tools={"species": "[]"})
    async with field_guide(fake).turn() as turn:
        result = await turn.acall("species", {})
    assert result.text == "[]"
    assert fake.open_sessions == 0


def test_identical_commands_cannot_both_be_answered() -> None:
    """Two tools with the very same command are one call to the sandbox; the fake says so."""
    tools = [ToolSpec.command_tool("a", "a", ["same"]), ToolSpec.command_tool("b", "b", ["same"])]
    fake = FakeSandbox(tools={"a": "A", "b": "B"}, registry=tools)
    with (
        Executor(Registry(tools), sandbox=fake).turn() as turn,
        pytest.raises(UnscriptedCallError, match="same command"),
    ):
        turn.call("a")


def test_bad_values_are_refused_when_built() -> None:
    """A fake file path must be absolute and an outbox name a plain name."""
    with pytest.raises(UsageError):
        FakeSandbox(files={"relative.txt": "x"})
    with pytest.raises(UsageError):
        FakeRun(files={"../escape": "x"})
    with pytest.raises(TypeError):
        FakeRun(exit_code="0")  # type: ignore[arg-type]


def test_grep_searches_the_fake_files_when_not_scripted() -> None:
    """Without a scripted answer, grep searches the in-memory files as the sandbox's script would."""
    registry = Registry()
    registry.add_builtin("grep")
    fake = FakeSandbox(
        files={"/workspace/b.md": "Otters\n", "/workspace/a/x.md": "otter\nheron\n"},
        default=FakeRun(exit_code=127),  # answers only what neither the script nor grep does
    )
    with Executor(registry, sandbox=fake).turn() as turn:
        found = turn.call("grep", {"pattern": "otter", "ignore_case": True})
        none = turn.call("grep", {"pattern": "kingfisher"})
    assert found.text == "a/x.md:1:otter\nb.md:1:Otters"
    assert (none.text, none.is_error) == ("No matches found.", False)


def test_exec_is_answered_from_the_script_and_recorded() -> None:
    """Turn.exec on a fake turn returns the scripted ExecResult and records what the host sent."""
    fake = FakeSandbox(
        exec={
            ("make", "test"): ExecResult(returncode=2, stdout=b"1 failed\n", stderr=b"boom\n"),
            "python3 -c 'print(1)'": "1\n",
        }
    )
    with Executor(Registry(), sandbox=fake).turn() as turn:
        failed = turn.exec(["make", "test"], input="in", cwd="src", env={"CI": "1"}, timeout=5)
        printed = turn.exec(["python3", "-c", "print(1)"])
    assert failed == ExecResult(returncode=2, stdout=b"1 failed\n", stderr=b"boom\n")
    assert (printed.returncode, printed.stdout, printed.success) == (0, b"1\n", True)
    assert fake.execs[0] == FakeExec(
        argv=("make", "test"), stdin=b"in", cwd="/workspace/src", env={"CI": "1"}, timeout=5.0
    )
    assert fake.execs[1].cwd == "/workspace"
    assert fake.calls == []


async def test_aexec_answers_from_a_function_of_the_exec() -> None:
    """A function answers every exec; a timed-out answer reads as a killed command (-9)."""

    def answer(call: FakeExec) -> ExecResult:
        return ExecResult(returncode=0, stdout=" ".join(call.argv).encode(), timed_out=True)

    fake = FakeSandbox(exec=answer)
    async with Executor(Registry(), sandbox=fake).turn() as turn:
        result = await turn.aexec(["sleep", "9"])
    assert (result.returncode, result.timed_out, result.stdout) == (-9, True, b"sleep 9")


def test_exec_output_is_cut_at_the_stream_bound() -> None:
    """Each stream past the exec bound is cut and the result says so, as a real sandbox does."""
    from astralvessel._executor._exec import OUTPUT_BYTES

    fake = FakeSandbox(exec=ExecResult(returncode=0, stdout=b"x" * (OUTPUT_BYTES + 5)))
    with Executor(Registry(), sandbox=fake).turn() as turn:
        result = turn.exec(["yes"])
    assert (len(result.stdout), result.truncated) == (OUTPUT_BYTES, True)


def test_unscripted_exec_and_host_mistakes_raise() -> None:
    """An exec the script does not answer raises UnscriptedCallError; a bad argv is UsageError."""
    fake = FakeSandbox(exec={("ls",): ""})
    with Executor(Registry(), sandbox=fake).turn() as turn:
        with pytest.raises(UnscriptedCallError, match="no answer for exec"):
            turn.exec(["rm", "-rf", "/"])
        with pytest.raises(UsageError, match="NUL"):
            turn.exec(["ls", "a\0b"])
    assert [call.argv for call in fake.execs] == [("rm", "-rf", "/")]
    with pytest.raises(UsageError, match="keyed by argv"):
        FakeSandbox(exec={("ls", 1): ""})  # type: ignore[dict-item]


def test_an_exec_answer_that_raises_sandbox_error_ends_the_fake_turn() -> None:
    """SandboxError from an exec answer reaches the host, and the next use starts a fresh turn."""

    def dies(call: FakeExec) -> str:
        raise SandboxError("the sandbox died")

    fake = FakeSandbox(exec={("crash",): dies, ("ok",): "fine"})
    with Executor(Registry(), sandbox=fake).turn() as turn:
        with pytest.raises(SandboxError):
            turn.exec(["crash"])
        assert turn.exec(["ok"]).stdout == b"fine"
    assert fake.open_sessions == 0


@pytest.mark.parametrize("writable_root", [False, True])
def test_the_fake_gives_the_writable_root_as_a_real_backend_does(writable_root: bool) -> None:
    """With writable_root the host writes under /etc and /opt; without, it is refused alike."""
    fake = FakeSandbox()
    executor = Executor(Registry(), sandbox=fake, writable_root=writable_root, root_identity=True)
    with executor.turn() as turn:
        for path in ("/etc/app.conf", "/opt/tool/bin"):
            if writable_root:
                turn.write_file(path, "x")
                assert turn.read_file(path) == b"x"
            else:
                with pytest.raises(SandboxPermissionError):
                    turn.write_file(path, "x")


def test_start_on_a_fake_turn_is_a_process_that_has_exited_as_scripted() -> None:
    """Turn.start is answered from exec=: its result merges the streams into the log."""
    fake = FakeSandbox(exec={"serve --port 8000": ExecResult(returncode=0, stdout=b"up\n")})
    with Executor(Registry(), sandbox=fake).turn() as turn:
        process = turn.start(["serve", "--port", "8000"], env={"MODE": "test"})
        assert (process.done(), process.poll()) == (True, 0)
        assert process.result(timeout=1) == ExecResult(returncode=0, stdout=b"up\n")
        process.kill()
        with pytest.raises(UnscriptedCallError):
            turn.start(["other"])
    assert fake.execs[0] == FakeExec(
        argv=("serve", "--port", "8000"),
        cwd="/workspace",
        env={"MODE": "test"},
        timeout=None,
        detached=True,
    )


async def test_astart_merges_stderr_into_the_log_and_cuts_it() -> None:
    """A detached process's stderr joins its log, cut at the log bound as a real one's is."""
    from astralvessel._executor._exec import LOG_BYTES

    fake = FakeSandbox(exec=ExecResult(returncode=3, stdout=b"o" * LOG_BYTES, stderr=b"e"))
    async with Executor(Registry(), sandbox=fake).turn() as turn:
        process = await turn.astart(["job"])
        result = await process.aresult()
    assert (result.returncode, len(result.stdout), result.stderr, result.truncated) == (
        3,
        LOG_BYTES,
        b"",
        True,
    )
