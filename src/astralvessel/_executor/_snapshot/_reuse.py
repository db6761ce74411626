"""Which files of a new capture the store holds already: the rules of an incremental snapshot.

A capture links, rather than copies, a file the store already holds with
certainty, from one of two sources (anything else is read from the sandbox):

- **The snapshot the turn opened from**, when its workspace is an overlay on
  that snapshot's tree: the file worker marks ``lower`` every file the turn's
  upper layer holds no entry for (no copy-up, no whiteout, no opaque folder
  over it; the overlay has no redirects), and such a file is the tree's own.
- **The turn's last capture**: a file whose inode, size, mtime and ctime are
  what that capture recorded, where the recorded times were older than the
  capture's start by more than a clock tick (git's "racily clean" rule): any
  write, ``chmod``, link, rename or replacement after the capture began sets a
  newer ctime, which no call can set back (ctime is the kernel's, from a clock
  the sandbox cannot step). A file changed too close to the capture is not
  recorded, so it is read again next time.

Either way the new entry's size and mode must equal the held file's, and one
held inode serves one name (a hard link is made as such, from the listing).
What the worker says only picks which bytes to reuse: every reused file's
digest is the host's own record, so a subverted worker can make a snapshot hold
its turn's older bytes, never bytes that disagree with the manifest.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import attrs

from ._manifest import Entry, EntryKind, Manifest
from ._value import TurnSnapshot

__all__ = [
    "RACY_NS",
    "Captures",
    "Held",
    "held_files",
    "matches",
    "recorded_stat",
    "store_tree",
    "with_digests",
]

#: ``CLOCK_REALTIME_COARSE`` (Linux), the clock a file's times come from; Python names it not.
_COARSE_CLOCK = 5


def _racy_ns() -> int:
    try:
        tick = int(time.clock_getres(_COARSE_CLOCK) * 1e9)
    except OSError:
        return 100_000_000
    return max(2 * tick, 1_000_000)


#: How much older than a capture's start a file's times must be to be recorded: two of the
#: kernel's coarse clock ticks (a file's times come from that clock, the capture's start
#: from the fine one, which runs up to a tick ahead), 8 ms at 250 Hz.
RACY_NS = _racy_ns()

#: A file's (inode, size, mtime_ns, ctime_ns) as the sandbox saw it.
Stat = tuple[int, int, int, int]


@attrs.frozen
class Held:
    """A file the store holds: its host path and its entry (a regular file's)."""

    path: bytes
    entry: Entry


def held_files(snapshot: TurnSnapshot, folder: Path) -> dict[bytes, Held]:
    """Every name of ``snapshot`` that is a regular file's bytes, a hard link's included,
    as held in ``folder`` (its tree, or a frozen layer's copy in the store: ``linkable``)."""
    base = os.fsencode(folder)
    files: dict[bytes, Entry] = {}
    held: dict[bytes, Held] = {}
    for entry in snapshot.manifest.entries:
        if entry.kind is EntryKind.FILE:
            files[entry.name] = entry
            held[entry.name] = Held(base + b"/" + entry.name, entry)
        elif entry.kind is EntryKind.HARDLINK and entry.target in files:
            held[entry.name] = Held(base + b"/" + entry.name, files[entry.target])
    return held


def store_tree(snapshot: TurnSnapshot) -> Path | None:
    """The folder a capture links ``snapshot``'s files from, without a copier: its tree in
    the store, or None for a frozen layer (on a tmpfs of its own: no link reaches it)."""
    return snapshot.path if snapshot.layer is None else None


def recorded_stat(item: dict[str, object], began_ns: int) -> Stat | None:
    """A listed file's stat to record, or None: unreadable, or changed too close to ``began_ns``."""
    found = _stat_of(item)
    if found is None or max(found[2], found[3]) >= began_ns - RACY_NS:
        return None
    return found


@attrs.define
class _Last:
    snapshot: weakref.ref[TurnSnapshot]
    stats: dict[bytes, Stat]


class Captures:
    """One turn's memory for incremental snapshots: its source, and its last captures.

    The captures are held weakly: a snapshot no one keeps is not kept alive (nor
    counted against the budget) for the sake of the next one, which then links
    from the newest capture still alive.
    """

    def __init__(
        self,
        source: TurnSnapshot | None,
        linkable: Callable[[TurnSnapshot], Path | None] = store_tree,
    ) -> None:
        """``linkable``: the folder a snapshot's files are linked from (None: read them),
        ``_freeze.store_copy`` for a turn (a frozen layer's copy, made on first need)."""
        self.source = source
        self._linkable = linkable
        self._captures: list[_Last] = []
        #: The frozen layer the turn now writes above (its fork's source), held weakly too.
        self._frozen: Callable[[], TurnSnapshot | None] | None = None

    def frozen(self, snapshot: TurnSnapshot) -> None:
        """The turn's workspace was frozen as ``snapshot`` and it writes on above it: the
        files a capture marks the lower layer's are that snapshot's, while it lives."""
        self._frozen = weakref.ref(snapshot)

    def _source(self) -> TurnSnapshot | None:
        # Once frozen, the turn lies on that snapshot (a fork's, stacked over its source):
        # a file its upper layer lacks is that one's, never the source's (changed since).
        if self._frozen is not None:
            return self._frozen()
        return self.source

    def lost(self) -> None:
        """The turn's workspace was frozen and the host lost the layer (``_freeze``'s
        ``lost``): it lies on that layer, no longer on its source, so no file a capture
        marks the lower layer's is linked from anything."""
        self._frozen = _gone

    def stacks(self) -> bool:
        """Whether the turn's next fork may freeze its own layer over its source's
        (``_freeze.stacks_on``): it lies on the source still (never frozen), and no
        capture of it is alive to link from (then a capture copies only what changed)."""
        return self._frozen is None and self._newest()[1] is None

    def reusable(self, listing: dict[bytes, dict[str, object]]) -> dict[bytes, Held]:
        """The held file each listed name may link to (before the size and mode checks)."""
        found: dict[bytes, Held] = {}
        last, snapshot = self._newest()
        if last is not None and snapshot is not None:
            held = self._held(snapshot)
            for name, stat in last.stats.items():
                item = listing.get(name)
                if item is not None and name in held and _stat_of(item) == stat:
                    found[name] = held[name]
        lower = [name for name, item in listing.items() if item.get("lower") is True]
        origin = self._source() if lower else None  # (a frozen layer's copy: only then)
        if origin is not None:
            source = self._held(origin)
            for name in lower:
                if name in source:
                    found.setdefault(name, source[name])
        return found

    def _held(self, snapshot: TurnSnapshot) -> dict[bytes, Held]:
        folder = self._linkable(snapshot)
        return {} if folder is None else held_files(snapshot, folder)

    def linkable(self) -> bool:
        """Whether a capture now could link files the store holds (a last capture alive,
        or a source): then it copies only what changed, where a frozen layer would hold
        the whole workspace again on the budget."""
        return self._source() is not None or self._newest()[1] is not None

    def _newest(self) -> tuple[_Last | None, TurnSnapshot | None]:
        self._captures = [last for last in self._captures if last.snapshot() is not None]
        for last in reversed(self._captures):
            snapshot = last.snapshot()
            if snapshot is not None:
                return last, snapshot
        return None, None

    def remember(self, snapshot: TurnSnapshot, stats: dict[bytes, Stat]) -> None:
        """Make ``snapshot`` (with the stats recorded of its files) the newest capture."""
        self._captures = [*self._captures[-(_KEPT - 1) :], _Last(weakref.ref(snapshot), stats)]


def _gone() -> TurnSnapshot | None:
    """The frozen snapshot of a turn whose layer the host lost: none."""
    return None


#: How many captures a turn remembers (each a stat per file), the newest alive serving.
_KEPT = 4


def _stat_of(item: dict[str, object]) -> Stat | None:
    found = item.get("stat")
    size = item.get("size")
    if not (isinstance(found, list) and len(found) == 3 and type(size) is int):
        return None
    if not all(type(value) is int for value in found):
        return None
    return (found[0], size, found[1], found[2])


def matches(held: Held, entry: Entry) -> bool:
    """Whether ``entry`` (a new regular file) may be the held file: same size and mode."""
    return held.entry.size == entry.size and held.entry.mode == entry.mode


def with_digests(manifest: Manifest, digests: dict[bytes, str]) -> Manifest:
    """``manifest`` with each regular file's digest from ``digests``."""
    entries = [
        entry.with_digest(digests[entry.name]) if entry.kind is EntryKind.FILE else entry
        for entry in manifest.entries
    ]
    return Manifest(
        entries=tuple(entries),
        total_bytes=manifest.total_bytes,
        file_count=manifest.file_count,
        notes=manifest.notes,
    )
