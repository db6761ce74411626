"""FakeSandbox: its scripted answers carry the outcome a real sandbox's would."""

from __future__ import annotations

import pytest

from astralvessel import Executor, Outcome, Registry
from astralvessel.testing import FakeRun, FakeSandbox


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ("ok\n", Outcome.OK),
        (FakeRun(output="no\n", exit_code=2), Outcome.FAILED),
        (FakeRun(output="slow", timed_out=True), Outcome.TIMED_OUT),
        (
            FakeRun(output="[memory limit: ...]", exit_code=137, stopped_by_limit=True),
            Outcome.LIMIT,
        ),
        (FakeRun(sandbox_died="the fake was killed"), Outcome.SANDBOX_LOST),
    ],
)
def test_scripted_answers_carry_their_outcome(answer: str | FakeRun, outcome: Outcome) -> None:
    """Each kind of scripted answer gives the outcome the same real result would."""
    fake = FakeSandbox(bash={"go": answer})
    registry = Registry()
    registry.add_builtin("bash")
    with Executor(registry, sandbox=fake).turn() as turn:
        assert turn.call("bash", {"command": "go"}).outcome is outcome


def test_a_sandbox_death_costs_one_call() -> None:
    """After a scripted death the next call runs in a fresh fake turn."""
    answers = iter([FakeRun(sandbox_died="gone"), FakeRun(output="back\n")])
    fake = FakeSandbox(default=lambda call: next(answers))
    registry = Registry()
    registry.add_builtin("bash")
    with Executor(registry, sandbox=fake).turn() as turn:
        died = turn.call("bash", {"command": "one"})
        after = turn.call("bash", {"command": "two"})
    assert "the sandbox died while running this call (gone)" in died.text
    assert (after.text, after.outcome) == ("back\n[exit code 0]", Outcome.OK)
