"""The result-text rules, held by the fake sandbox and a real backend alike.

Each case runs one tool twice: as a real command in bubblewrap, and as the
fake's scripted answer for what that command does. Both must show the model
the same text, so a host's tests on the fake see what production shows.
"""

from __future__ import annotations

import gc
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry, ToolSpec
from astralvessel.sandbox import Bubblewrap
from astralvessel.testing import Answer, FakeRun, FakeSandbox

MakeExecutor = Callable[..., Executor]


@pytest.fixture(params=["fake", "bubblewrap"])
def make_executor(request: pytest.FixtureRequest) -> MakeExecutor:
    """Build an executor on the fake (answering from ``fake``) or on real bubblewrap."""

    def make(
        *tools: ToolSpec,
        fake: Mapping[str, Answer] | None = None,
        bash: Mapping[str, Answer] | None = None,
        builtins: tuple[str, ...] = (),
        agent: Agent | None = None,
        **kw: object,
    ) -> Executor:
        registry = Registry.for_agent(agent) if agent is not None else Registry(tools)
        for name in builtins:
            registry.add_builtin(name)
        sandbox = (
            FakeSandbox(tools=fake, bash=bash, registry=registry)
            if request.param == "fake"
            else Bubblewrap()
        )
        return Executor(registry, sandbox=sandbox, **kw)  # type: ignore[arg-type]

    return make


def sh(name: str, script: str, **kw: object) -> ToolSpec:
    return ToolSpec.command_tool(name, f"Test tool {name}.", ["sh", "-c", script], **kw)  # type: ignore[arg-type]


def py(name: str, code: str, **kw: object) -> ToolSpec:
    return ToolSpec.command_tool(
        name,
        f"Test tool {name}.",
        ["python3", "-c", textwrap.dedent(code)],
        **kw,  # type: ignore[arg-type]
    )


def test_output_is_shown_as_is(make_executor: MakeExecutor) -> None:
    """A command's output is the result text, unchanged."""
    executor = make_executor(sh("hello", "echo hello"), fake={"hello": "hello\n"})
    with executor.turn() as turn:
        result = turn.call("hello")
    assert (result.text, result.is_error, result.exit_code) == ("hello\n", False, 0)


def test_empty_output_shows_exit_code(make_executor: MakeExecutor) -> None:
    """A command that prints nothing shows `[exit code N]`; non-zero is an error."""
    executor = make_executor(
        sh("ok", "true"), sh("bad", "exit 3"), fake={"ok": "", "bad": FakeRun(exit_code=3)}
    )
    with executor.turn() as turn:
        ok, bad = turn.call("ok"), turn.call("bad")
    assert (ok.text, ok.is_error, ok.exit_code) == ("[exit code 0]", False, 0)
    assert (bad.text, bad.is_error, bad.exit_code) == ("[exit code 3]", True, 3)


def test_failing_command_keeps_its_output(make_executor: MakeExecutor) -> None:
    """A non-zero exit with output shows the output alone and marks an error."""
    executor = make_executor(
        sh("fail", "echo 'no such page' >&2; exit 2"),
        fake={"fail": FakeRun(output="no such page\n", exit_code=2)},
    )
    with executor.turn() as turn:
        result = turn.call("fail")
    assert (result.text, result.is_error, result.exit_code) == ("no such page\n", True, 2)


def test_timeout_keeps_output_and_says_so(make_executor: MakeExecutor) -> None:
    """A call past its time limit keeps what it printed and ends with the timeout note."""
    executor = make_executor(
        sh("slow", "echo started; sleep 60", timeout_seconds=1),
        fake={"slow": FakeRun(output="started\n", timed_out=True)},
    )
    with executor.turn() as turn:
        result = turn.call("slow")
    assert result.text == "started\n[timed out after 1 s]"
    assert (result.timed_out, result.is_error, result.exit_code) == (True, True, None)


def test_output_is_cut_at_the_cap_with_a_count(make_executor: MakeExecutor) -> None:
    """Output beyond tool_output_chars is cut, and the note names how many characters went."""
    executor = make_executor(
        py("big", "print('é' * 50000)"),
        fake={"big": "é" * 50000 + "\n"},
        output_chars=1000,
    )
    with executor.turn() as turn:
        result = turn.call("big")
    assert result.dropped_chars == 49001
    assert result.text == "é" * 1000 + "\n[output truncated: 49001 more characters were dropped]"


def test_bash_always_shows_exit_code(make_executor: MakeExecutor) -> None:
    """bash ends every result with `[exit code N]`, and a non-zero exit is an error."""
    executor = make_executor(
        builtins=("bash",), bash={"echo hi; exit 4": FakeRun(output="hi\n", exit_code=4)}
    )
    with executor.turn() as turn:
        result = turn.call("bash", {"command": "echo hi; exit 4"})
    assert (result.text, result.is_error, result.exit_code) == ("hi\n[exit code 4]", True, 4)


def test_grep_without_a_match_is_not_an_error(make_executor: MakeExecutor) -> None:
    """grep that finds nothing says so plainly, without marking an error."""
    executor = make_executor(builtins=("grep",), fake={"grep": FakeRun(exit_code=1)})
    with executor.turn() as turn:
        result = turn.call("grep", {"pattern": "no-such-text-anywhere", "path": "/workspace"})
    assert (result.text, result.is_error) == ("No matches found.", False)


def test_refused_arguments_run_nothing(make_executor: MakeExecutor) -> None:
    """Arguments that break the schema are refused with the same words, and nothing runs."""
    tool = sh(
        "page",
        "cat",
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    )
    executor = make_executor(tool, fake={"page": "never shown"})
    with executor.turn() as turn:
        bad_json, missing = turn.call("page", "{not json"), turn.call("page", {})
        unknown = turn.call("nope", {})
    assert [r.is_error for r in (bad_json, missing, unknown)] == [True, True, True]
    assert missing.text.startswith("Error: invalid arguments for page: 'name' is a required")
    assert "nope" in unknown.text
    if isinstance(executor.sandbox, FakeSandbox):
        assert executor.sandbox.calls == []


def test_outbox_files_come_back(make_executor: MakeExecutor) -> None:
    """Files a call leaves in $VESSEL_OUTBOX come back with name, size and content."""
    executor = make_executor(
        sh("report", "printf hello > $VESSEL_OUTBOX/r.txt"),
        fake={"report": FakeRun(files={"r.txt": "hello"})},
    )
    with executor.turn() as turn:
        result = turn.call("report")
        (file,) = result.files
        assert (file.name, file.size) == ("r.txt", 5)
        assert Path(file.path).read_bytes() == b"hello"
    assert result.text == "[exit code 0]"
    # The file outlives the turn while a result names it (a host attaches it to the model's
    # next request), and goes with the last one.
    path = Path(file.path)
    assert path.read_bytes() == b"hello"
    del file, result
    gc.collect()
    assert not path.exists()


def test_file_tools_read_mounted_data_alike(make_executor: MakeExecutor, tmp_path: Path) -> None:
    """read, list and glob show a mounted folder with the same words on both."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "otter.md").write_text("otters\nswim\n")
    (tmp_path / "top.txt").write_text("x" * 10)
    for path in (tmp_path, tmp_path / "notes"):  # the sandbox's user must be able to read them
        path.chmod(0o755)
    executor = make_executor(builtins=("read", "list", "glob"), mounts={"/data": tmp_path})
    with executor.turn() as turn:
        page = turn.call("read", {"path": "/data/notes/otter.md", "offset": 2})
        listing = turn.call("list", {"path": "/data"})
        found = turn.call("glob", {"pattern": "*.md", "path": "/data"})
        missing = turn.call("read", {"path": "/data/none.md"})
        outside = turn.call("read", {"path": "/root/secret"})
    assert page.text == "2\tswim"
    assert listing.text == "notes/\ntop.txt"
    assert found.text == "/data/notes/otter.md"
    assert (missing.text, missing.is_error) == ("/data/none.md does not exist.", True)
    assert outside.is_error
    assert "outside" in outside.text


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    """A folder of pages the sandbox's user can read, to mount at /data; beside it, a grep agent."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "vessel.toml").write_text(
        'workdir = "/data"\n[tools]\nbuiltin = ["grep"]\n'
    )
    tmp_path = tmp_path / "pages"
    (tmp_path / "species").mkdir(parents=True)
    (tmp_path / "species" / "otter.md").write_text("# Otter\nOtters eat fish.\nSpraints mark\n")
    (tmp_path / "species" / "heron.md").write_text("# Heron\nHerons eat fish too.\n")
    (tmp_path / "species-notes.txt").write_text("otter notes\n")
    (tmp_path / ".hidden.md").write_text("fish in a hidden file\n")
    (tmp_path / "blob.bin").write_bytes(b"fish\0fish\n")
    for path in (tmp_path, tmp_path / "species"):
        path.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize(
    ("arguments", "text", "is_error"),
    [
        (
            {"pattern": "fish"},
            ".hidden.md:1:fish in a hidden file\n"
            "species/heron.md:2:Herons eat fish too.\n"
            "species/otter.md:2:Otters eat fish.",
            False,
        ),
        (
            {"pattern": "otter", "ignore_case": True, "glob": "*.md"},
            "species/otter.md:1:# Otter\nspecies/otter.md:2:Otters eat fish.",
            False,
        ),
        (
            {"pattern": "^#", "path": "/data/species/heron.md"},
            "/data/species/heron.md:1:# Heron",
            False,
        ),
        ({"pattern": "notes", "path": "/data"}, "/data/species-notes.txt:1:otter notes", False),
        ({"pattern": "nothing-like-this"}, "No matches found.", False),
        ({"pattern": "x", "path": "/data/none"}, "/data/none does not exist.", True),
        (
            {"pattern": "x", "path": "blob.bin"},
            "blob.bin is a binary file; grep searches text files only.",
            True,
        ),
        (
            {"pattern": "e", "max_results": 2},
            ".hidden.md:1:fish in a hidden file\nspecies/heron.md:1:# Heron\n"
            "[more than 2 matching lines; showing the first 2: narrow the pattern, path or glob, "
            "or raise max_results (at most 1000)]",
            False,
        ),
    ],
)
def test_grep_reads_alike(
    make_executor: MakeExecutor,
    pages: Path,
    arguments: dict[str, object],
    text: str,
    is_error: bool,
) -> None:
    """grep finds the same lines, in the same order, with the same messages, on both."""
    executor = make_executor(agent=Agent.load(pages.parent / "agent"), mounts={"/data": pages})
    with executor.turn() as turn:
        result = turn.call("grep", arguments)
    assert (result.text, result.is_error) == (text, is_error)
