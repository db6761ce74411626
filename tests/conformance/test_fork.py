"""A child forked while a turn is open neither uses nor ends the parent's sandbox.

The child inherits the turn's pipes to the sandbox server but not the thread that
reads them: a request it sent was answered to the parent, which took the unknown
answer for a broken protocol and lost its turn, while the child waited out the
call's timeout; a child that closed the turn killed the parent's sandbox. Now the
child's use raises ``TurnClosedError`` at once and its close leaves the sandbox be.
"""

from __future__ import annotations

from astralvessel import Turn, TurnClosedError

from ..forking import in_forked_child


def test_a_forked_child_neither_uses_nor_ends_the_parents_turn(turn: Turn) -> None:
    assert turn.exec(["true"]).returncode == 0  # the sandbox runs before the fork

    def child() -> str:
        try:
            turn.exec(["true"])
        except TurnClosedError as error:
            met = "refused" if "forked" in str(error) else f"TurnClosedError: {error}"
        else:
            met = "ran in the parent's sandbox"
        turn.close()  # the child's own end of the turn: the sandbox stays the parent's
        return met

    assert in_forked_child(child) == "refused"
    assert turn.exec(["echo", "still here"]).stdout == b"still here\n"
