"""A call that makes its own outbox folder unlistable is told so, on every backend."""

from __future__ import annotations

from .calls import run

#: How a call leaves its outbox folder so that it cannot be listed: (shell, the OS's reason).
UNLISTABLE = {
    "removed": ("rm -r $VESSEL_OUTBOX", "No such file or directory"),
    "swapped for a link": ("rm -r $VESSEL_OUTBOX && ln -s /tmp $VESSEL_OUTBOX", "Not a directory"),
    "unreadable": ("chmod 0 $VESSEL_OUTBOX", "Permission denied"),
}
NOTE = "[outbox: cannot be listed, no file returned: "


def test_an_outbox_that_cannot_be_listed_says_so(session):
    """A call that removes its outbox folder or swaps it for a link gets no file back and a
    line saying why, never an outbox that looks empty; one it made unreadable gets its file
    (a server that may read what the calls' user cannot) or the same line. The turn goes on:
    the next call's outbox works."""
    for case, (shell, reason) in UNLISTABLE.items():
        outcome = run(session, "/bin/sh", "-c", f"echo kept > $VESSEL_OUTBOX/kept.txt; {shell}")
        if case == "unreadable" and outcome.files:
            assert [f.name for f in outcome.files] == ["kept.txt"]
            assert "[outbox:" not in outcome.output
            continue
        assert outcome.files == (), case
        assert NOTE in outcome.output, case
        assert f"{reason}]\n" in outcome.output, (case, outcome.output)
    after = run(session, "/bin/sh", "-c", "echo again > $VESSEL_OUTBOX/again.txt")
    assert [f.name for f in after.files] == ["again.txt"]
    assert "[outbox:" not in after.output
