"""The agent-folder checks behind --vessel-check, as pure functions over real folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel import ConfigError, Registry, ToolSpec
from astralvessel.testing import _checks
from astralvessel.testing._checks import DIALECTS, check_folder, schema_problems

ROOT = Path(__file__).parents[2]
FOLDERS = [ROOT / "examples" / "field-guide", ROOT / "tests" / "testing" / "sample_host" / "agent"]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.parent.name + "/" + p.name)
def test_the_repositorys_agents_pass_every_check(folder: Path, dialect: str) -> None:
    """The example agent and the sample host's agent load, and every schema passes each dialect."""
    assert schema_problems(check_folder(folder), dialect) == []


def test_a_folder_that_does_not_load_raises_its_problems(tmp_path: Path) -> None:
    """check_folder raises the loader's ConfigError, naming the bad key."""
    (tmp_path / "vessel.toml").write_text('colour = "red"\n[tools]\nbuiltin = ["read"]\n')
    with pytest.raises(ConfigError) as info:
        check_folder(tmp_path)
    assert info.value.problems == ("vessel.toml: colour: unknown key (check the spelling)",)


def test_a_missing_sdk_is_a_problem_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dialect whose SDK cannot be imported reports what to install instead of passing."""
    monkeypatch.setitem(
        _checks.SDK_TYPES, "anthropic", ("no_such_sdk.types", "ToolParam", "no-such-sdk")
    )
    registry = Registry([ToolSpec.command_tool("hello", "Say hello.", ["echo"])])
    (problem,) = schema_problems(registry, "anthropic")
    assert "install no-such-sdk" in problem


def test_an_unknown_dialect_is_a_problem() -> None:
    """Asking for a dialect that does not exist is reported, not ignored."""
    assert schema_problems(Registry(), "gemini") == [
        "'gemini' is not a dialect; use one of openai, openai-responses, anthropic, mcp"
    ]
