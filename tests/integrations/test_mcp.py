"""The MCP server, driven by the MCP SDK's own client over stdio against a real sandbox."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

from astralvessel.cli import build_parser, main

from .conftest import BACKEND

TOOLS = {
    "tools/echo.toml": """
        name = "echo"
        description = "Echo the arguments back."
        command = ["python3", "-c", "import sys; print(sys.stdin.read())"]
        """,
    "tools/count.toml": """
        name = "count"
        description = "Count the words of a page."
        command = ["python3", "-c", "import sys, pathlib; print(len(pathlib.Path(sys.argv[1][7:]).read_text().split()))"]
        input = "args"
        [parameters]
        type = "object"
        required = ["path"]
        [parameters.properties.path]
        type = "string"
        """,
    "tools/slow.toml": """
        name = "slow"
        description = "Takes far too long."
        command = ["sh", "-c", "echo started; sleep 60"]
        timeout_seconds = 1
        """,
    "tools/remember.toml": """
        name = "remember"
        description = "Keep a note in the workspace."
        command = ["sh", "-c", "cat > \\"$HOME/note\\" && echo kept"]
        """,
    "tools/recall.toml": """
        name = "recall"
        description = "Read the note back."
        command = ["sh", "-c", "cat \\"$HOME/note\\""]
        """,
}

VESSEL = """
    name = "mcp-test"
    workdir = "/data"
    scopes = ["tools:read", "tools:files"]
    [tools]
    builtin = ["list", "bash"]
    declared = ["tools/echo.toml", "tools/count.toml", "tools/slow.toml",
                "tools/remember.toml", "tools/recall.toml"]
    """


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


#: A model's hostile arguments, by name: each comes back as an error result saying why.
#: (The SDK's client cannot send a lone surrogate.) 200 levels is past the SDK's own JSON
#: parser, which drops such a message unanswered; the server answers it itself.
HOSTILE: dict[str, tuple[str, dict[str, Any]]] = {
    "hostile_2mb": ("echo", {"q": "x" * (2 << 20)}),
    "hostile_deep": ("echo", _nested(70)),
    "hostile_deeper": ("echo", _nested(200)),
    "hostile_nul_argv": ("count", {"path": "otter\0.md"}),
}


def _write_agent(root: Path) -> tuple[Path, Path]:
    agent = root / "agent"
    for rel, text in {"vessel.toml": VESSEL, **TOOLS}.items():
        path = agent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    data = root / "data"
    data.mkdir()
    (data / "otter.md").write_text("A sleek hunter of fish.\n")
    return agent, data


async def _session(agent: Path, data: Path) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "astralvessel.cli",
            "mcp",
            str(agent),
            "--backend",
            BACKEND,
            "--mount",
            f"/data={data}",
        ],
        # The SDK passes the server only a few variables; keep the tree under test.
        env={
            **get_default_environment(),
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )
    found: dict[str, Any] = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        found["init"] = await session.initialize()
        found["tools"] = (await session.list_tools()).tools
        found["echo"] = await session.call_tool("echo", {"q": "otter"})
        found["count"] = await session.call_tool("count", {"path": "otter.md"})
        found["refused"] = await session.call_tool("count", {"path": "otter.md", "flag": "--x"})
        found["bad_type"] = await session.call_tool("echo", None)
        found["unknown"] = await session.call_tool("bash", {"command": "id"})
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, total, message))

        found["slow"] = await session.call_tool("slow", {}, progress_callback=on_progress)
        found["progress"] = progress
        found["remember"] = await session.call_tool("remember", {"text": "vole"})
        found["recall"] = await session.call_tool("recall", {})
        found["concurrent"] = await asyncio.gather(
            *(session.call_tool("echo", {"n": n}) for n in range(4))
        )
        for name, arguments in HOSTILE.items():
            found[name] = await session.call_tool(*arguments)
        found["after_hostile"] = await session.call_tool("echo", {"q": "still here"})
    return found


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real MCP session against ``astralvessel mcp`` in a subprocess: everything it answered."""
    agent, data = _write_agent(tmp_path_factory.mktemp("mcp"))
    return asyncio.run(asyncio.wait_for(_session(agent, data), 120))


def _text(result: Any) -> str:
    (block,) = result.content
    assert block.type == "text"
    return str(block.text)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_arguments_are_error_results(session: dict[str, Any], name: str) -> None:
    """2 MB, 70 or 200 levels deep and NUL for an argv tool each come back as an error
    result, and the session answers after them."""
    assert session[name].is_error, _text(session[name])
    assert _text(session["after_hostile"]).strip() == '{"q": "still here"}'


def test_server_names_itself_after_the_agent(session: dict[str, Any]) -> None:
    """The server's name is the agent's name."""
    assert session["init"].server_info.name == "mcp-test"


def test_lists_granted_tools_with_their_schemas(session: dict[str, Any]) -> None:
    """Tools come with their input schemas; a tool outside the granted scopes is not listed."""
    tools = {tool.name: tool for tool in session["tools"]}
    assert list(tools) == ["list", "echo", "count", "slow", "remember", "recall"]
    assert tools["count"].input_schema["required"] == ["path"]
    assert tools["echo"].description == "Echo the arguments back."


def test_declared_tool_runs_in_the_sandbox(session: dict[str, Any]) -> None:
    """A declared command's output comes back as one text block, not an error."""
    assert not session["echo"].is_error
    assert _text(session["echo"]) == '{"q": "otter"}\n'
    assert _text(session["count"]).strip() == "5"


def test_json_object_output_is_structured_content(session: dict[str, Any]) -> None:
    """A result whose text is one JSON object also comes as structuredContent; others do not."""
    assert session["echo"].structured_content == {"q": "otter"}
    assert session["count"].structured_content is None
    assert session["refused"].structured_content is None


def test_tools_carry_titles_and_hints(session: dict[str, Any]) -> None:
    """The list built-in is titled and marked read-only; declared tools claim nothing."""
    tools = {tool.name: tool for tool in session["tools"]}
    assert tools["list"].title == "List a folder"
    assert tools["list"].annotations.read_only_hint is True
    assert tools["echo"].annotations is None


def test_a_running_call_reports_progress(session: dict[str, Any]) -> None:
    """A call with a progress token gets progress notifications out of its timeout."""
    assert session["progress"]
    _, total, message = session["progress"][0]
    assert total == 1
    assert message is not None
    assert message.startswith("slow: running for")
    assert [p[0] for p in session["progress"]] == sorted(p[0] for p in session["progress"])


def test_refusal_is_an_error_result(session: dict[str, Any]) -> None:
    """An argument the tool does not declare is refused with isError set."""
    assert session["refused"].is_error
    assert "flag" in _text(session["refused"])


def test_missing_arguments_mean_an_empty_object(session: dict[str, Any]) -> None:
    """A call without arguments runs with ``{}``."""
    assert _text(session["bad_type"]) == "{}\n"


def test_tool_outside_scopes_is_refused(session: dict[str, Any]) -> None:
    """Calling a tool the server did not grant is an error result naming the tools there are."""
    assert session["unknown"].is_error
    assert "there is no tool named 'bash'" in _text(session["unknown"])


def test_timeout_is_an_error_result_with_the_output_so_far(session: dict[str, Any]) -> None:
    """A call past its timeout is killed; the client sees its output and the timeout note."""
    assert session["slow"].is_error
    assert _text(session["slow"]) == "started\n[timed out after 1 s]"


def test_one_session_is_one_turn(session: dict[str, Any]) -> None:
    """Calls of one session share the turn's workspace."""
    assert _text(session["remember"]) == "kept\n"
    assert _text(session["recall"]) == '{"text": "vole"}'


def test_concurrent_calls_all_answer(session: dict[str, Any]) -> None:
    """Calls sent at once over one session each get their own answer."""
    assert [_text(r) for r in session["concurrent"]] == [f'{{"n": {n}}}\n' for n in range(4)]


def test_broken_agent_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``astralvessel mcp`` on a bad folder exits 2 before serving, saying what is wrong."""
    (tmp_path / "vessel.toml").write_text("[tools]\nbuiltin = ['teleport']\n")
    assert main(["mcp", str(tmp_path)]) == 2
    assert "unknown built-in 'teleport'" in capsys.readouterr().err


def test_unknown_backend_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``astralvessel mcp --backend`` with an unknown backend exits 2 before serving."""
    (tmp_path / "vessel.toml").write_text("[tools]\nbuiltin = ['list']\n")
    assert main(["mcp", str(tmp_path), "--backend", "teleporter"]) == 2
    assert "unknown backend 'teleporter'; backends are bubblewrap" in capsys.readouterr().err


def test_relax_takes_promise_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``astralvessel mcp --relax`` takes the API's promise names and refuses others with exit 2."""
    parsed = build_parser().parse_args(["mcp", str(tmp_path), "--relax", "no-network"])
    assert parsed.relax == ["no-network"]
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["mcp", str(tmp_path), "--relax", "teleportation"])
    assert caught.value.code == 2
    assert "invalid choice: 'teleportation'" in capsys.readouterr().err
