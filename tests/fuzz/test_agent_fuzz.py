"""Property-based fuzzing of agent folders: loading one either works or raises ConfigError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import astralvessel as av

BUDGET = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

SCALARS = (
    st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.text(max_size=30)
)
VALUES = SCALARS | st.lists(st.text(max_size=20), max_size=4)
VESSEL_KEYS = st.sampled_from(
    ["name", "workdir", "tool_timeout_seconds", "tool_output_chars", "scopes", "surprise"]
)
TOOL_KEYS = st.sampled_from(
    ["name", "description", "command", "service", "input", "timeout_seconds", "scope", "odd"]
)
SCHEMAS = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "integer", "nope"])})
    | st.fixed_dictionaries({"$ref": st.text(max_size=30)}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=8), inner)}
    ),
    max_leaves=6,
)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # a TOML basic string for everything JSON escapes


def _table(values: dict[str, object]) -> str:
    return "".join(f"{json.dumps(key)} = {_toml_value(value)}\n" for key, value in values.items())


def _load(folder: Path) -> None:
    problems: tuple[str, ...] = ("loaded",)
    try:
        av.Agent.load(folder)
    except av.ConfigError as exc:
        problems = exc.problems
    # A ConfigError always says what is wrong, one non-empty line per problem.
    assert problems
    assert all(problem.strip() for problem in problems)


@BUDGET
@given(text=st.text(max_size=400) | st.binary(max_size=400))
def test_any_vessel_text_loads_or_raises_config_error(tmp_path: Path, text: str | bytes) -> None:
    """Any bytes as vessel.toml load or raise ConfigError, never anything else."""
    folder = tmp_path / "agent"
    folder.mkdir(exist_ok=True)
    path = folder / "vessel.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    _load(folder)


@BUDGET
@given(
    vessel=st.dictionaries(VESSEL_KEYS, VALUES, max_size=5),
    tool=st.dictionaries(TOOL_KEYS, VALUES, max_size=7),
    schema=SCHEMAS,
)
def test_any_tool_file_loads_or_raises_config_error(
    tmp_path: Path, vessel: dict[str, object], tool: dict[str, object], schema: dict[str, object]
) -> None:
    """Structured but arbitrary vessel.toml and tool files load or raise ConfigError."""
    folder = tmp_path / "agent"
    folder.mkdir(exist_ok=True)
    (folder / "vessel.toml").write_text(
        _table(vessel) + '[tools]\ndeclared = ["t.toml"]\n', encoding="utf-8"
    )
    (folder / "t.toml").write_text(
        _table(tool) + "[parameters]\n" + _table(schema), encoding="utf-8", errors="replace"
    )
    _load(folder)


@pytest.mark.parametrize("size", [1 << 20, (1 << 20) + 1])
def test_config_size_bound_is_exact(tmp_path: Path, size: int) -> None:
    """A vessel.toml of exactly 1 MiB is parsed; one byte more is refused unread."""
    folder = tmp_path / "agent"
    folder.mkdir()
    body = '[tools]\nbuiltin = ["read"]\n'
    (folder / "vessel.toml").write_text(body + "#" * (size - len(body) - 1) + "\n")
    if size > 1 << 20:
        with pytest.raises(av.ConfigError, match="larger than 1048576 bytes"):
            av.Agent.load(folder)
    else:
        assert av.Agent.load(folder).builtin == ("read",)
