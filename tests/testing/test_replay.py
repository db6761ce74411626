"""FakeSandbox.from_ledger: a real turn's ledger answers a test's calls with identical results."""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry
from astralvessel.testing import FakeSandbox, UnscriptedCallError

ROOT = Path(__file__).parents[2]
FIELD_GUIDE = ROOT / "examples" / "field-guide"
SAMPLE = ROOT / "examples" / "sample-data"
ALL_SCOPES = ["tools:read", "tools:files", "tools:search", "tools:execute"]

#: One of each kind of call that reaches the sandbox: declared, bash, grep, the file tools,
#: a failure, and the same call twice with different answers.
CALLS: list[tuple[str, object]] = [
    ("species", '{"habitat": "rivers"}'),
    ("word_count", {"path": "species/otter.md"}),
    ("bash", {"command": "ls species | head -3; echo err >&2; exit 4"}),
    ("grep", {"pattern": "otter", "path": "species"}),
    ("read", {"path": "species/otter.md", "limit": 5}),
    ("glob", {"pattern": "species/*.md"}),
    ("list", {"path": "species"}),
    ("read", {"path": "species/nowhere.md"}),
    ("bash", {"command": "cat /proc/sys/kernel/random/uuid"}),
    ("bash", {"command": "cat /proc/sys/kernel/random/uuid"}),
]


def _registry() -> Registry:
    registry = Registry.for_agent(Agent.load(FIELD_GUIDE))
    registry.add_builtin("bash")
    return registry


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A ledger recorded from a real bubblewrap turn of CALLS, and the texts it returned."""
    folder = tmp_path_factory.mktemp("ledger")
    executor = Executor(
        _registry(),
        sandbox="bubblewrap",
        mounts={"/data": str(SAMPLE)},
        scopes=ALL_SCOPES,
        ledger=folder,
    )
    with executor, executor.turn() as turn:
        texts = [turn.call(name, arguments).text for name, arguments in CALLS]
    (path,) = folder.iterdir()
    return path, texts


def _replaying(path: Path) -> Executor:
    return Executor(
        _registry(),
        sandbox=FakeSandbox.from_ledger(path),
        mounts={"/data": str(SAMPLE)},
        scopes=ALL_SCOPES,
    )


def test_a_real_turn_replays_to_identical_texts(recorded: tuple[Path, list[str]]) -> None:
    """Every call of the real turn, made again on the replaying fake, gets the same text."""
    path, texts = recorded
    assert texts[-1] != texts[-2]  # two equal calls the real sandbox answered differently
    with _replaying(path).turn() as turn:
        replayed = [turn.call(name, arguments).text for name, arguments in CALLS]
    assert replayed == texts


def test_calls_match_by_arguments_before_order(recorded: tuple[Path, list[str]]) -> None:
    """A call made out of the recorded order still gets its own recorded answer."""
    path, texts = recorded
    with _replaying(path).turn() as turn:
        assert turn.call(*CALLS[6]).text == texts[6]
        assert turn.call(*CALLS[0]).text == texts[0]


def test_an_unrecorded_call_names_its_difference(recorded: tuple[Path, list[str]]) -> None:
    """A call the ledger does not hold fails naming the argument that differs."""
    path, _ = recorded
    with _replaying(path).turn() as turn, pytest.raises(UnscriptedCallError) as raised:
        turn.call("species", {"habitat": "coasts"})
    message = str(raised.value)
    assert "has no call species" in message
    assert "argument 'habitat' differs: 'coasts' here, 'rivers' in the ledger" in message


def test_a_call_past_the_recording_says_so(recorded: tuple[Path, list[str]]) -> None:
    """A third equal call, when the ledger held two, fails saying every record was answered."""
    path, _ = recorded
    with _replaying(path).turn() as turn:
        for _ in range(2):
            turn.call(*CALLS[-1])
        with pytest.raises(UnscriptedCallError, match="answered already"):
            turn.call(*CALLS[-1])
