"""The CLI contract: commands, output and exit codes, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLE = str(ROOT / "examples" / "field-guide")
MOUNT = f"/data={ROOT / 'examples' / 'sample-data'}"


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "astralvessel", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_valid_agent() -> None:
    """check exits 0 for a valid agent folder."""
    done = cli("check", EXAMPLE)
    assert done.returncode == 0, done.stderr
    assert "field-guide: ok" in done.stdout


def test_check_invalid_agent(tmp_path: Path) -> None:
    """check prints the ConfigError text on stderr and exits 2."""
    (tmp_path / "vessel.toml").write_text("[tools]\nbuiltin = ['cat']\n")
    done = cli("check", str(tmp_path))
    assert done.returncode == 2
    assert "vessel.toml: tools.builtin: unknown built-in 'cat'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("dialect", "key"),
    [("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")],
)
def test_tools_prints_schemas(dialect: str, key: str) -> None:
    """tools prints the schemas of the chosen dialect as JSON."""
    done = cli("tools", EXAMPLE, "--dialect", dialect)
    assert done.returncode == 0, done.stderr
    schemas = json.loads(done.stdout)
    assert all(key in s for s in schemas)
    assert len(schemas) == 6


def test_tools_default_dialect_and_scope_filter() -> None:
    """tools defaults to openai and filters by --scope."""
    done = cli("tools", EXAMPLE, "--scope", "tools:files")
    names = [s["function"]["name"] for s in json.loads(done.stdout)]
    assert names == ["read", "glob", "list"]


def test_call_runs_species_in_a_sandbox() -> None:
    """call runs the example in the default confined backend and prints the result text."""
    done = cli("call", EXAMPLE, "species", '{"habitat": "estuaries"}', "--mount", MOUNT)
    assert done.returncode == 0, done.stderr
    names = [row["name"] for row in json.loads(done.stdout)]
    assert names == ["Pied avocet", "Eurasian curlew", "Grey heron", "Harbour seal"]


def test_call_reads_arguments_from_stdin_and_prints_json() -> None:
    """'-' reads the arguments from stdin; --json prints the whole result."""
    done = cli(
        "call",
        EXAMPLE,
        "word_count",
        "-",
        "--mount",
        MOUNT,
        "--json",
        stdin='{"path": "species/eel.md"}',
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["text"] == "species/eel.md: 35 words\n"
    for key in ("text", "is_error", "exit_code", "timed_out", "dropped_chars", "files"):
        assert key in result
    assert result["backend"] != "unconfined"


def test_call_relax_gives_up_a_promise_as_the_api_does() -> None:
    """--relax PROMISE reaches the executor: the result's policy identity records it."""
    args = ["call", EXAMPLE, "word_count", '{"path": "species/eel.md"}', "--mount", MOUNT, "--json"]
    strict, relaxed = cli(*args), cli(*args, "--relax", "process-limit")
    assert strict.returncode == relaxed.returncode == 0, strict.stderr + relaxed.stderr
    strict_id, relaxed_id = (json.loads(d.stdout)["policy_id"] for d in (strict, relaxed))
    assert strict_id
    assert relaxed_id
    assert strict_id != relaxed_id


def test_call_error_result_exits_1() -> None:
    """A result that is an error exits 1 and still prints its text."""
    done = cli("call", EXAMPLE, "species", '{"habitat": 3}', "--mount", MOUNT)
    assert done.returncode == 1
    assert done.stdout.startswith("Error: invalid arguments for species at 'habitat'")


@pytest.mark.parametrize(
    "args",
    [
        ["call", EXAMPLE, "species", "--backend", "no-such-backend"],
        ["call", "/nonexistent/agent", "species"],
        ["call", EXAMPLE, "species", "--mount", "data"],
        ["call", EXAMPLE, "species", "--scope", "tools:root"],
        ["call", EXAMPLE, "species", "--frobnicate"],
        ["call", EXAMPLE, "species", "--relax", "teleportation"],
        ["tools", EXAMPLE, "--dialect", "gemini"],
    ],
)
def test_host_errors_exit_2_with_one_line(args: list[str]) -> None:
    """Bad backends, folders, mounts, scopes and flags exit 2 with one clear line, no traceback."""
    done = cli(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip()
    assert len(done.stderr.strip().splitlines()) <= 2


def test_doctor_json_lists_backends() -> None:
    """doctor --json reports every built-in backend with what it enforces."""
    done = cli("doctor", "--json")
    assert done.returncode == 0, done.stderr
    names = {r["name"] for r in json.loads(done.stdout)}
    assert {"bubblewrap", "nsjail", "docker", "unconfined"} <= names


def test_console_script_matches_module() -> None:
    """The installed astralvessel command behaves like python -m astralvessel."""
    script = Path(sys.executable).with_name("astralvessel")
    done = subprocess.run(
        [str(script), "check", EXAMPLE], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
