"""An ordinary user's Docker frozen layers save, load and copy to the store: the host
cannot read their files (the turns' leased uid's), so the backend's reader container
streams each file's bytes (``LayerReader``: ``contents``) and the host writes the saved
form and the store copy itself, checking every file's size and digest against the
manifest as it goes. Real containers, no mocks.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from astralvessel import Executor, Registry, TurnSnapshot
from astralvessel._executor._snapshot._freeze import store_copy
from astralvessel._executor._snapshot._manifest import EntryKind, Manifest
from astralvessel._executor._snapshot._tree import scan_tree
from astralvessel.errors import SnapshotError
from astralvessel.sandbox.docker import Docker

from ..snapshot.test_frozen_fork import _MAKE, _sh
from .conftest import BASE_IMAGE
from .test_frozen_stack_user import _fork_of_a_fork

pytestmark = pytest.mark.skipif(
    os.geteuid() == 0, reason="root's Docker host reads its staged layers itself"
)

#: What a turn opened from the saved snapshot must show as the turn that froze did.
_VIEW = "cd /workspace && ls -lAR --time-style=+ . | sed 's/ [0-9]* [a-z0-9]* [a-z0-9]* / /' "
_SUMS = (
    "cd /workspace && find . -path ./outbox -prune -o -type f -print0 | sort -z | xargs -0 md5sum"
)


@pytest.fixture
def executor(docker_api: object) -> Iterator[Executor]:
    with Executor(Registry(), sandbox=Docker(base_image=BASE_IMAGE, pull=False)) as executor:
        yield executor


def _frozen(executor: Executor, script: str = _MAKE) -> tuple[Any, list[Any], TurnSnapshot]:
    """A fresh turn with ``script``'s files and two forks, and the snapshot the first of
    them returns before its sandbox starts: the frozen layer, held by descriptor."""
    parent = executor.turn()
    _sh(parent, script)
    forks = parent.fork(2)
    snapshot = forks[0].snapshot()
    assert snapshot.held_layer is not None, "the fork's source is not a held frozen layer"
    with pytest.raises(PermissionError):
        os.listdir(snapshot.path / "d")  # the point: the host cannot read the layer
    return parent, forks, snapshot


def _saved(snapshot: TurnSnapshot) -> bytes:
    buffer = io.BytesIO()
    snapshot.save(buffer)
    return buffer.getvalue()


def _opens_alike(executor: Executor, snapshot: TurnSnapshot, turn: Any) -> None:
    """A turn opened from ``snapshot`` shows ``turn``'s files, byte for byte."""
    with executor.turn(snapshot=snapshot) as opened:
        assert _sh(opened, _SUMS) == _sh(turn, _SUMS)
        assert _sh(opened, "cd /workspace && readlink link; ls -A . d/e") == _sh(
            turn, "cd /workspace && readlink link; ls -A . d/e"
        )


def test_a_frozen_layer_saves_and_loads_back_equal(executor: Executor, tmp_path: Path) -> None:
    parent, forks, snapshot = _frozen(executor)
    with parent, forks[0], forks[1]:
        data = _saved(snapshot)
        loaded = TurnSnapshot.load(io.BytesIO(data))
        assert loaded == snapshot
        assert loaded.held_layer is None  # a store tree of the host's own
        _opens_alike(executor, loaded, parent)
        # The same bytes each time: the saved form keeps no owner or time.
        assert _saved(snapshot) == data
        # Another process, which never saw the layer, loads the file.
        path = tmp_path / "frozen.snapshot"
        snapshot.save(path)
        assert _loaded_elsewhere(path) == snapshot.content_id


def _loaded_elsewhere(path: Path) -> str:
    """The content id another interpreter loads ``path`` as, after checking one file."""
    code = (
        "import sys\nfrom astralvessel import TurnSnapshot\n"
        "s = TurnSnapshot.load(sys.argv[1])\n"
        "assert (s.path / 'shared').read_text() == 'parent\\n'\n"
        "print(s.content_id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_stack_of_two_and_three_layers_saves_and_loads_back_equal(
    executor: Executor, tmp_path: Path
) -> None:
    parent, child, grandchild, source = _fork_of_a_fork(executor)
    with parent, child, grandchild:
        loaded = TurnSnapshot.load(io.BytesIO(_saved(source)))
        assert loaded == source
        _opens_alike(executor, loaded, child)
        _sh(grandchild, "cd /workspace && rm shared && echo 3 > three && mv d/f2 d/e/moved")
        (third,) = grandchild.fork(1)
        with third:
            deeper = third.snapshot_source
            assert deeper is not None
            assert len(deeper.held_stack) == 3
            path = tmp_path / "stack.snapshot"
            deeper.save(path)
            again = TurnSnapshot.load(path)
            assert again == deeper
            with executor.turn(snapshot=again) as opened:
                assert _sh(opened, _SUMS) == _sh(grandchild, _SUMS)
                assert _sh(opened, "cat /workspace/three") == "3\n"


def test_a_pickled_frozen_layer_is_its_saved_form(executor: Executor) -> None:
    import pickle

    parent, forks, snapshot = _frozen(executor)
    with parent, forks[0], forks[1]:
        assert pickle.loads(pickle.dumps(snapshot)) == snapshot  # noqa: S301 - our own bytes


def test_the_store_copy_of_a_frozen_layer_is_its_files(executor: Executor) -> None:
    parent, forks, snapshot = _frozen(executor)
    with parent, forks[0], forks[1]:
        copy = store_copy(snapshot)
        assert copy is not None, "the frozen layer's store copy failed"
        assert str(copy) != str(snapshot.path)
        scanned = scan_tree(copy, max_bytes=1 << 30, max_files=1000)
        assert scanned.content_id == snapshot.content_id
        assert store_copy(snapshot) == copy  # made once, kept with the layer
        # A capture of a fork that changed one file links the rest from the copy.
        _sh(forks[1], "echo changed > /workspace/shared")
        captured = forks[1].snapshot()
        assert captured != snapshot
        linked = os.stat(captured.path / "d" / "f3").st_ino
        assert linked == os.stat(copy / "d" / "f3").st_ino, "the capture read, not linked"
        _sh(forks[1], "echo parent > /workspace/shared")
        assert forks[1].snapshot() == snapshot


def _tampered(snapshot: TurnSnapshot, change: Any) -> TurnSnapshot:
    """``snapshot``'s tree under a manifest whose first nonempty file's entry is changed
    by ``change``: what a reader sending other bytes than the layer's would meet."""
    entries = list(snapshot.manifest.entries)
    at = next(i for i, e in enumerate(entries) if e.kind is EntryKind.FILE and e.size > 1)
    entries[at] = change(entries[at])
    return attrs.evolve(snapshot, manifest=Manifest.build(entries, snapshot.manifest.notes))


def test_bytes_that_do_not_match_the_manifest_are_refused(executor: Executor) -> None:
    parent, forks, snapshot = _frozen(executor)
    with parent, forks[0], forks[1]:
        wrong_digest = _tampered(snapshot, lambda e: e.with_digest("0" * 64))
        with pytest.raises(SnapshotError, match="changed since its manifest was made"):
            _saved(wrong_digest)
        shorter = _tampered(snapshot, lambda e: attrs.evolve(e, size=e.size - 1))
        with pytest.raises(SnapshotError, match="changed since its manifest was made"):
            _saved(shorter)
        longer = _tampered(snapshot, lambda e: attrs.evolve(e, size=e.size + 1))
        with pytest.raises(SnapshotError, match="changed since its manifest was made"):
            _saved(longer)
        # The reader is started again after a stream left unfinished: the layer saves.
        assert TurnSnapshot.load(io.BytesIO(_saved(snapshot))) == snapshot


def test_a_large_file_streams_in_pieces(executor: Executor, tmp_path: Path) -> None:
    big = "cd /workspace && head -c 67108864 /dev/urandom > big && echo parent > shared"
    parent, forks, snapshot = _frozen(executor, big + " && mkdir -p d && ln -s shared link")
    with parent, forks[0], forks[1]:
        path = tmp_path / "big.snapshot"
        tracemalloc.start()
        try:
            with open(path, "wb", buffering=0) as out:
                snapshot.save(out)  # type: ignore[arg-type]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, f"the save held {peak} bytes of a 64 MiB file at once"
        assert TurnSnapshot.load(path) == snapshot


def test_a_frozen_layer_saves_after_its_turns_and_executor_closed(docker_api: object) -> None:
    backend = Docker(base_image=BASE_IMAGE, pull=False)
    with Executor(Registry(), sandbox=backend) as executor:
        parent, forks, snapshot = _frozen(executor)
        with parent, forks[0], forks[1]:
            expected = _sh(parent, _SUMS)
    # The snapshot keeps its layer (by descriptor) and what reads it: it saves still.
    loaded = TurnSnapshot.load(io.BytesIO(_saved(snapshot)))
    assert loaded == snapshot
    sandbox = Docker(base_image=BASE_IMAGE, pull=False)
    with Executor(Registry(), sandbox=sandbox) as again, again.turn(snapshot=loaded) as opened:
        assert _sh(opened, _SUMS) == expected
