"""Property-based fuzzing of a real turn: arguments, tool output and outbox contents.

The contract under test: only the host's errors raise; every call of the model
comes back as a ``ToolResult``; the turn survives every example; the host holds
a bounded amount of output and writes a bounded number of outbox files. Each
test has a fixed, small budget (derandomized, so CI runs the same examples) to
keep the suite at well under two minutes per backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import astralvessel as av
from astralvessel.sandbox._session import OUTBOX_FILES_PER_TURN, ServerSession

from .test_hostile import alive

BUDGET = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# The emit tool acts on these keys; fuzzed arguments must not order a long sleep.
_EMIT_KEYS = {"files", "raw", "dirs", "nest", "sleep", "out", "repeat", "exit"}

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**1200), max_value=10**1200)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
ARGUMENT_OBJECTS = st.dictionaries(
    st.text(max_size=12).filter(lambda k: k not in _EMIT_KEYS), JSON_VALUES, max_size=6
)
RAW_ARGUMENTS = (
    st.text(max_size=200)
    | st.binary(max_size=200)
    | st.builds(lambda d: "[" * d + "]" * d, st.integers(0, 30_000))
    | ARGUMENT_OBJECTS.map(lambda o: json.dumps(o, allow_nan=True))
)
TOOLS = st.sampled_from(["emit", "flags", "read", "glob", "list", "grep", "nope", ""])


@pytest.fixture(scope="module")
def fuzz_turn(executor: av.Executor) -> Iterator[av.Turn]:
    """One turn shared by a module's fuzz examples: it must survive all of them."""
    with executor.turn() as turn:
        yield turn


def _session(turn: av.Turn) -> ServerSession:
    session = turn.session
    assert isinstance(session, ServerSession)
    return session


@BUDGET
@given(tool=TOOLS, arguments=ARGUMENT_OBJECTS | RAW_ARGUMENTS)
def test_any_arguments_give_a_result(fuzz_turn: av.Turn, tool: str, arguments: object) -> None:
    """Any arguments to any tool name come back as a result; the turn lives on."""
    result = fuzz_turn.call(tool, arguments)
    assert isinstance(result, av.ToolResult)
    assert isinstance(result.text, str)
    result.text.encode("utf-8")  # always text a model API can carry
    alive(fuzz_turn)


@BUDGET
@given(
    out=st.text(alphabet=st.characters(max_codepoint=255), max_size=300),
    repeat=st.integers(1, 20_000),
    code=st.integers(0, 255),
)
def test_any_output_is_bounded(fuzz_turn: av.Turn, out: str, repeat: int, code: int) -> None:
    """Whatever bytes a call prints, the model sees at most the cap and the host holds at most 4x."""
    result = fuzz_turn.call("emit", {"out": out, "repeat": repeat, "exit": code})
    cap = fuzz_turn.executor.output_chars
    assert result.is_error == (code != 0)
    assert len(result.text) <= cap + 200  # the cap, plus our notes
    assert _session(fuzz_turn).max_buffered_output <= cap * 4
    alive(fuzz_turn)


NAMES = st.binary(min_size=1, max_size=255).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in {b".", b"..", b".nest"}
)


@BUDGET
@given(
    entries=st.lists(
        st.tuples(NAMES, st.integers(0, 5000)), max_size=130, unique_by=lambda e: e[0]
    ),
    nest=st.integers(0, 400),
)
def test_any_outbox_is_bounded(
    fuzz_turn: av.Turn, entries: list[tuple[bytes, int]], nest: int
) -> None:
    """Whatever a call leaves in its outbox: at most 100 files, real paths, UTF-8 names."""
    raw = [[name.hex(), size] for name, size in entries]
    result = fuzz_turn.call("emit", {"raw": raw, "nest": nest})
    assert not result.is_error, result.text
    assert len(result.files) <= 100
    sizes = dict(entries)
    for file in result.files:
        assert file.path.read_bytes() == b"x" * file.size
        assert sizes[file.name.encode("utf-8")] == file.size
    returned = len(result.files)
    if returned < len(entries) or nest:
        assert "[outbox: " in result.text
    alive(fuzz_turn)


def test_the_turn_wrote_a_bounded_number_of_files(fuzz_turn: av.Turn) -> None:
    """After every example above, the host holds at most the turn's budget of outbox files
    (in the turn's temporary outbox folder, which lives until the turn's close)."""
    outbox = _session(fuzz_turn)._turn_outbox.temporary
    assert outbox is not None, "the examples above returned no outbox file"
    count = sum(1 for path in outbox.path.rglob("*") if path.is_file())
    assert count <= OUTBOX_FILES_PER_TURN
