"""A turn's temporary outbox folder goes once the turn is closed and no OutboxFile names it."""

from __future__ import annotations

import gc

from astralvessel.sandbox._api import OutboxFile
from astralvessel.sandbox._temporary_outbox import TemporaryOutbox


def _leave(outbox: TemporaryOutbox, name: str) -> OutboxFile:
    path = outbox.path / "call-1" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"x")
    return outbox.keep_for(OutboxFile(name=name, size=1, path=path))


def test_a_hundred_turns_keep_only_the_folders_their_live_files_name() -> None:
    """Closed turns whose files are gone (or that left none) leave no folder; one whose file
    is still held keeps it until that file goes, whichever of close and release comes last."""
    held: list[OutboxFile] = []
    folders = []
    for number in range(100):
        outbox = TemporaryOutbox("test-outbox")
        folders.append(outbox.path)
        if number % 2:
            _leave(outbox, "dropped")  # released before its turn closes
        if number == 10:
            held.append(_leave(outbox, "held"))
        outbox.close()
    gc.collect()
    assert [folder for folder in folders if folder.exists()] == [folders[10]]
    assert held[0].path.read_bytes() == b"x"
    held.clear()
    gc.collect()
    assert not folders[10].exists()
