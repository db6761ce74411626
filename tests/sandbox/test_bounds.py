"""The server's turn-wide memory rule as a pure function, and the note the host renders."""

from __future__ import annotations

from astralvessel.sandbox._session import ServerSession, _Pending
from astralvessel.sandbox.server._bounds import over_limit

MIB = 1 << 20


def test_over_limit_names_the_largest_call_only_past_the_limit():
    """Calls together at the limit go on; past it, the largest one (lowest id on a tie) stops."""
    assert over_limit({1: 100 * MIB, 2: 156 * MIB}, 256 * MIB) is None
    assert over_limit({1: 100 * MIB, 2: 157 * MIB}, 256 * MIB) == 2
    assert over_limit({4: 200 * MIB, 3: 200 * MIB}, 256 * MIB) == 3
    assert over_limit({}, 0) is None


def test_memory_stop_becomes_a_note_the_model_reads():
    """An exit frame that says the memory watch stopped the call ends the output with why."""
    item = _Pending(kind="run")
    item.output += b"partial"
    item.exit = {"exit_code": None, "memory": [300 * MIB, 256 * MIB]}
    outcome = ServerSession._outcome(item)
    assert outcome.exit_code is None
    assert outcome.output == (
        "partial\n[memory limit: the turn's calls held 300 MiB, more than the 256 MiB limit; "
        "this call's processes were stopped]\n"
    )
