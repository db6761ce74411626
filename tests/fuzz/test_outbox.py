"""Whatever a call leaves in its outbox, the server survives and the host stays bounded."""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
from pathlib import Path

import astralvessel as av

from .test_hostile import alive


def test_each_call_has_its_own_outbox(executor: av.Executor) -> None:
    """Calls running at once each get exactly the files they wrote, never another's."""

    async def main() -> list[av.ToolResult]:
        async with executor.turn() as turn:
            return await asyncio.gather(
                *(
                    turn.acall("emit", {"files": [[f"from-{i}", i + 1]], "sleep": 0.3 * (i % 2)})
                    for i in range(4)
                )
            )

    results = asyncio.run(main())
    for i, result in enumerate(results):
        assert [(f.name, f.size) for f in result.files] == [(f"from-{i}", i + 1)]


def test_files_outlive_the_turn_in_the_hosts_folder(executor: av.Executor, tmp_path: Path) -> None:
    """With outbox_dir, a result's files are still there after the turn ends."""
    mine = av.Executor(executor.registry, sandbox=executor.sandbox, outbox_dir=tmp_path / "out")
    with mine.turn() as turn:
        result = turn.call("emit", {"files": [["kept.txt", 7]]})
    (file,) = result.files
    assert file.path.read_bytes() == b"x" * 7
    assert file.path.is_relative_to(tmp_path / "out")


def _our_outbox_folders() -> set[Path]:
    """This process's temporary outbox folders (a turn's, or an executor's before)."""
    return set(Path(tempfile.gettempdir()).glob(f"astralvessel-*outbox-{os.getpid()}-*"))


def test_default_outbox_lives_while_a_result_names_it(executor: av.Executor) -> None:
    """Without outbox_dir, a turn's folder outlives the turn while a result names its files, and
    goes with the last of them, the executor still alive: no folder per turn piles up."""
    before = _our_outbox_folders()
    mine = av.Executor(executor.registry, sandbox=executor.sandbox)
    with mine.turn() as turn:
        result = turn.call("emit", {"files": [["kept", 1]]})
    (file,) = result.files
    assert file.path.read_bytes() == b"x"
    # The turn's own folder, nothing else of ours (before: one folder per executor).
    assert _our_outbox_folders() - before == {file.path.parent.parent}
    del result, file
    gc.collect()
    assert _our_outbox_folders() - before == set()
    del mine


def test_name_that_is_not_utf8_is_skipped_with_a_note(turn: av.Turn) -> None:
    """A file name that is not UTF-8 is not returned, the model is told, the server lives."""
    result = turn.call("emit", {"files": [["ok", 2]], "raw": [[b"bad\xff".hex(), 3]]})
    assert [f.name for f in result.files] == ["ok"]
    assert "[outbox: 1 entries not returned: 1 a name that is not UTF-8]" in result.text
    alive(turn)


def test_deeply_nested_folders_do_not_crash_the_server(turn: av.Turn) -> None:
    """3000 nested folders in the outbox are removed without recursion."""
    result = turn.call("emit", {"nest": 3000, "files": [["f", 1]]})
    assert not result.is_error, result.text
    assert [f.name for f in result.files] == ["f"]
    assert "1 not a plain file" in result.text
    alive(turn)


def test_many_long_names_keep_the_exit_frame_small(turn: av.Turn) -> None:
    """5000 files with 200-character names: 100 come back, the rest are counted."""
    files = [[f"{i:05d}" + "n" * 195, 0] for i in range(5000)]
    result = turn.call("emit", {"files": files})
    assert len(result.files) == 100
    assert result.files[0].name == files[0][0]
    assert "4900 more than 100 files" in result.text
    alive(turn)


def test_thirty_thousand_empty_files_write_at_most_a_hundred(turn: av.Turn) -> None:
    """30 000 empty files make the host write 100 files, not 20 000."""
    result = turn.call("emit", {"files": [[f"e{i}", 0] for i in range(30_000)]})
    assert len(result.files) == 100
    folder = result.files[0].path.parent
    assert len(list(folder.iterdir())) == 100
    alive(turn)


def test_the_turn_writes_at_most_its_budget_of_files(turn: av.Turn) -> None:
    """Past 1000 outbox files in one turn, further files are counted, not written."""
    kept = 0
    for _ in range(10):
        kept += len(turn.call("emit", {"files": [[f"f{i}", 0] for i in range(100)]}).files)
    assert kept == 1000
    result = turn.call("emit", {"files": [["one-more", 1]]})
    assert result.files == ()
    assert "past the turn's 1000 outbox files" in result.text


def test_an_empty_outbox_leaves_no_folder_behind(turn: av.Turn) -> None:
    """Calls that leave their outbox empty leave no folder of theirs in the outbox."""
    for _ in range(3):
        assert turn.call("emit", {}).files == ()
    listed = turn.call(
        "bash",
        {"command": 'cd "$VESSEL_OUTBOX/.." && echo left: * && echo "mine: ${VESSEL_OUTBOX##*/}"'},
    )
    assert not listed.is_error, listed.text
    left, mine = listed.text.splitlines()[:2]
    # Only the listing call's own outbox is there.
    assert left == mine.replace("mine", "left")


def test_an_outbox_left_holding_a_link_or_a_folder_is_taken_apart(turn: av.Turn) -> None:
    """An outbox that is not empty (a link, an empty folder) still comes back counted."""
    result = turn.call(
        "bash", {"command": 'ln -s /etc/passwd "$VESSEL_OUTBOX/link"; mkdir "$VESSEL_OUTBOX/d"'}
    )
    assert result.files == ()
    assert "2 not a plain file" in result.text
    alive(turn)


def test_a_call_that_removes_the_outbox_folder_does_not_break_the_next(turn: av.Turn) -> None:
    """A call may remove the outbox folder whole; the next call's outbox is made again."""
    turn.call("bash", {"command": 'rm -rf "$(dirname "$VESSEL_OUTBOX")"'})
    result = turn.call("emit", {"files": [["after", 3]]})
    assert not result.is_error, result.text
    assert [(f.name, f.size) for f in result.files] == [("after", 3)]
