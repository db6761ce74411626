"""What a call's result says about outbox files that did not come back (pure, no I/O).

One wording for every backend: the server session renders the ``exit`` frame's
``skipped`` and ``unlisted`` with these, docker-exec its own listing's findings.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["UNLISTED_MAX", "skipped_note", "unlisted_note"]

#: The characters of the OS's words kept in the unlisted note.
UNLISTED_MAX = 300


def skipped_note(skipped: Mapping[str, int]) -> str:
    """The line the model reads when outbox entries were left out, counted by reason."""
    reasons = "; ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    return f"[outbox: {sum(skipped.values())} entries not returned: {reasons}]\n"


def unlisted_note(why: str) -> str:
    """The line the model reads when its outbox folder could not be listed: no file came back,
    and ``why`` (the path and the OS's words) says so, not an outbox that looks empty."""
    return f"[outbox: cannot be listed, no file returned: {why[:UNLISTED_MAX]}]\n"
