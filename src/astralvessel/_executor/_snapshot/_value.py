"""``TurnSnapshot``: a turn's files as an immutable value, held in the host's snapshot store.

A snapshot is files, not processes: the workspace (the server's per-call
``outbox`` folder aside), taken between calls. Running and detached processes,
the egress proxy's connections, the leased identity and the host's mounts are
not in it. Its identity is its manifest's content id, so two snapshots of the
same files are equal wherever and whenever they were taken; it is cheap to
pass between threads, and pickles (for Ray, or any process) as its saved form.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

import attrs

from ...errors import SnapshotError, UsageError
from ._archive import extract_archive, write_archive
from ._manifest import EntryKind, Manifest
from ._store import Tree, new_folder

__all__ = ["DEFAULT_LOAD_MAX_BYTES", "DEFAULT_LOAD_MAX_FILES", "TurnSnapshot"]

#: What ``TurnSnapshot.load`` accepts unless told otherwise: a 4 GiB tree of a million names.
DEFAULT_LOAD_MAX_BYTES = 4 << 30
DEFAULT_LOAD_MAX_FILES = 1_000_000

PathOrFile = str | os.PathLike[str] | BinaryIO


@attrs.frozen(eq=False, repr=False)
class TurnSnapshot:
    """A turn's files at one moment: open turns from it with ``Executor.turn(snapshot=...)``.

    Made by ``Turn.snapshot()`` (or ``Turn.fork``) and ``TurnSnapshot.load``;
    equal and hashed by ``content_id``. Its tree stays on the host while any
    snapshot value refers to it; ``save`` writes the portable form.
    """

    manifest: Manifest = attrs.field(validator=attrs.validators.instance_of(Manifest))
    _tree: Tree = attrs.field(alias="tree", validator=attrs.validators.instance_of(Tree))

    @property
    def content_id(self) -> str:
        """``sha256:`` and the hash of the canonical manifest: same files, same id."""
        return self.manifest.content_id

    @property
    def total_bytes(self) -> int:
        """The regular files' bytes (a sparse file counts its holes)."""
        return self.manifest.total_bytes

    @property
    def file_count(self) -> int:
        """Every name in the snapshot: files, folders and links."""
        return self.manifest.file_count

    @property
    def notes(self) -> tuple[str, ...]:
        """What was changed to keep the files (set-id bits dropped)."""
        return self.manifest.notes

    @property
    def path(self) -> Path:
        """The snapshot's tree on the host (read-only by contract: turns copy from it)."""
        return self._tree.path

    @property
    def layer(self) -> Tree | None:
        """The frozen layer's tree (``_freeze``: a sandbox's workspace tmpfs staged at
        ``path``, whose files no store tree can hard-link across), or None."""
        return self._tree if self._tree.mounted else None

    @property
    def stack(self) -> tuple[Tree, ...]:
        """The staged frozen layers ``path`` shows, top first (root's: one for a fresh
        turn's freeze, more for a fork's stacked over it, ``Tree.stacked``); empty for a
        store tree or a layer held by descriptor."""
        return self._tree.stack

    @property
    def held_layer(self) -> int | None:
        """The frozen layer's descriptor this process holds (an ordinary user's host,
        ``Tree.held_layer``: ``path`` is then its ``/proc/self/fd`` name), or None (a
        held stack's merged view is no layer: ``held_stack``)."""
        return None if self._tree.layers else self._tree.held

    @property
    def held_stack(self) -> tuple[Tree, ...]:
        """The held frozen layers ``path`` shows, top first (an ordinary user's: one for
        a fresh turn's freeze, more for a fork's stacked over it, ``Tree.held_stacked``);
        empty for a store tree or root's staged layers."""
        return self._tree.held_stack

    def save(self, dest: PathOrFile) -> None:
        """Write the portable form (a POSIX pax tar, manifest first) to a path or binary file."""
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as out:
                self._write(out)
        elif _is_binary(dest, "write"):
            self._write(dest)
        else:
            raise UsageError(f"TurnSnapshot.save takes a path or a binary file, not {dest!r}")

    def _write(self, out: BinaryIO) -> None:
        read = self._tree.reader
        if read is None or self._tree.held is None:
            write_archive(self.path, self.manifest, out)
            return
        # An ordinary user's Docker layer (or stack): its files are the turn's uid's, so
        # the backend's reader streams them; written and checked here as any tree's.
        files = [(e.name, e.size) for e in self.manifest.entries if e.kind is EntryKind.FILE]
        try:
            with read(self._tree.held) as layer:
                write_archive(self.path, self.manifest, out, layer.contents(files))
        except OSError as exc:
            raise SnapshotError(f"the frozen layer cannot be read to save it: {exc}") from exc

    @classmethod
    def load(
        cls,
        src: PathOrFile,
        *,
        max_bytes: int = DEFAULT_LOAD_MAX_BYTES,
        max_files: int = DEFAULT_LOAD_MAX_FILES,
    ) -> TurnSnapshot:
        """Read a saved snapshot, checked whole before any file is written.

        Raises ``SnapshotError`` for a truncated, tampered or hostile file, or
        one past ``max_bytes`` or ``max_files``.
        """
        if isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as stream:
                return cls._extract(stream, max_bytes, max_files)
        if _is_binary(src, "read"):
            return cls._extract(src, max_bytes, max_files)
        raise UsageError(f"TurnSnapshot.load takes a path or a binary file, not {src!r}")

    @classmethod
    def _extract(cls, src: BinaryIO, max_bytes: int, max_files: int) -> TurnSnapshot:
        tree = Tree(new_folder() / "tree", None)
        manifest = extract_archive(src, tree.path, max_bytes=max_bytes, max_files=max_files)
        return cls(manifest=manifest, tree=tree)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TurnSnapshot):
            return NotImplemented
        return self.content_id == other.content_id

    def __hash__(self) -> int:
        return hash(self.content_id)

    def __repr__(self) -> str:
        return (
            f"TurnSnapshot({self.content_id[:19]}..., {self.file_count} names, "
            f"{self.total_bytes} bytes)"
        )

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        # Another process (a Ray node) gets the saved form and checks it as any loaded file.
        buffer = io.BytesIO()
        self.save(buffer)
        return (_from_saved, (buffer.getvalue(),))


def _from_saved(data: bytes) -> TurnSnapshot:
    return TurnSnapshot.load(io.BytesIO(data))


def _is_binary(value: object, method: str) -> bool:
    return callable(getattr(value, method, None)) and not isinstance(value, io.TextIOBase)
