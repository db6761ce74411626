"""A call that makes its own outbox folder unlistable is told so, on every backend; one that
makes it (or its files) unreadable gets its files back, on every backend."""

from __future__ import annotations

from .calls import run

#: How a call leaves its outbox folder so that it cannot be listed: (shell, the OS's reason).
UNLISTABLE = {
    "removed": ("rm -r $VESSEL_OUTBOX", "No such file or directory"),
    "swapped for a link": ("rm -r $VESSEL_OUTBOX && ln -s /tmp $VESSEL_OUTBOX", "Not a directory"),
}
NOTE = "[outbox: cannot be listed, no file returned: "


def test_an_outbox_that_cannot_be_listed_says_so(session):
    """A call that removes its outbox folder or swaps it for a link gets no file back and a
    line saying why, never an outbox that looks empty. One that made the folder and a file
    mode 000 gets both files back, as from any folder of its own (a server reads them as
    root in its namespace; docker-exec, with no server, gives the owner back its modes once
    the call is over). The turn goes on: the next call's outbox works."""
    for case, (shell, reason) in UNLISTABLE.items():
        outcome = run(session, "/bin/sh", "-c", f"echo kept > $VESSEL_OUTBOX/kept.txt; {shell}")
        assert outcome.files == (), case
        assert NOTE in outcome.output, case
        assert f"{reason}]\n" in outcome.output, (case, outcome.output)
    outcome = run(
        session,
        "/bin/sh",
        "-c",
        "cd $VESSEL_OUTBOX && echo kept > kept.txt && echo shut > shut.txt && chmod 0 shut.txt "
        "&& chmod 0 $VESSEL_OUTBOX",
    )
    assert sorted(f.name for f in outcome.files) == ["kept.txt", "shut.txt"], outcome.output
    assert sorted(f.path.read_text() for f in outcome.files) == ["kept\n", "shut\n"]
    assert "[outbox:" not in outcome.output
    after = run(session, "/bin/sh", "-c", "echo again > $VESSEL_OUTBOX/again.txt")
    assert [f.name for f in after.files] == ["again.txt"]
    assert "[outbox:" not in after.output
