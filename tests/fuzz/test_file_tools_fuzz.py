"""Property-based fuzzing of the model's file tools with hostile paths and hostile file names.

The contract: whatever path or pattern a model sends (lone surrogates, NUL,
controls, "..", names past the kernel's bounds) and whatever names the files
have (any bytes), ``read``, ``list``, ``glob`` and ``grep`` give a result the
model can read (valid Unicode, an error that says what to do) and the turn
goes on. Budgets are small and derandomized, so CI runs the same examples quickly.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import astralvessel as av

BUDGET = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: What a model might put in a path: any characters, lone surrogates and NULs included.
MODEL_TEXT = st.lists(
    st.characters(codec=None, exclude_categories=())
    | st.sampled_from(["\ud800", "\udcff", "\udc80", "\0", "\n", "\x1b[2J", "..", "/", "*", "é"]),
    max_size=30,
).map("".join)
PATHS = MODEL_TEXT | st.sampled_from(["../" * 100, "é" * 200, "a" * 300, "odd", "odd/**"])

#: Names of any bytes a call made earlier, as a model meets them.
NAMES = [b"caf\xe9", b"\xff\xfe", b"\xed\xa0\x80", b"new\nline", b"\x1b[31mred", b"\x80" * 255]


@pytest.fixture
def odd_turn(turn: av.Turn) -> av.Turn:
    """A turn whose workspace holds a folder of hostile names, made by a call."""
    script = (
        "import os, sys\n"
        "os.makedirs(b'/workspace/odd', exist_ok=True)\n"
        "for n in sys.argv[1:]:\n"
        "    open(b'/workspace/odd/' + os.fsencode(n), 'wb').write(b'a line\\n')\n"
    )
    made = turn.exec(["python3", "-c", script, *map(os.fsdecode, NAMES)])
    assert made.returncode == 0, made.stderr
    return turn


@BUDGET
@given(tool=st.sampled_from(["read", "list", "glob", "grep"]), path=PATHS, as_json=st.booleans())
def test_file_tools_answer_any_path(odd_turn: av.Turn, tool: str, path: str, as_json: bool):
    """Each file tool answers any path with readable text; the turn's next call still runs."""
    arguments: dict[str, object] = {"path": path}
    if tool in ("glob", "grep"):
        arguments["pattern"] = path or "*"
    result = odd_turn.call(tool, json.dumps(arguments) if as_json else arguments)
    assert result.text
    result.text.encode("utf-8")  # a model's API takes only valid Unicode
    if "\0" in path or any(0xD800 <= ord(c) <= 0xDFFF for c in path):
        assert result.is_error
    alive = odd_turn.call("bash", {"command": "echo alive"})
    assert alive.text.startswith("alive")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list", {"path": "/workspace/odd"}),
        ("glob", {"path": "/workspace", "pattern": "odd/*"}),
        ("grep", {"path": "/workspace/odd", "pattern": "line"}),
    ],
)
def test_hostile_names_are_shown_readably(odd_turn: av.Turn, tool: str, arguments: dict):
    """Listing, globbing and grepping a folder of hostile names shows each, as valid text."""
    result = odd_turn.call(tool, arguments)
    assert not result.is_error, result.text
    result.text.encode("utf-8")
    assert "caf\ufffd" in result.text
    if tool != "grep":  # the file tools' own listings say how to reach such names
        assert "ls -b" in result.text
