"""A snapshot's manifest: one ``Entry`` per name, in canonical order, and its content id.

The manifest is the whole truth of a snapshot: every check of a saved or
captured tree compares the files against it. Its invariants live on the types
(``Entry`` and ``Manifest`` refuse, on every construction path, what a hostile
archive could claim), so a value that exists is one extraction may trust:

- a name is relative, ``/``-separated, without an empty, ``.`` or ``..``
  component or a NUL byte; it need not be UTF-8;
- entries are sorted by name bytes, each once, each under a folder entry
  listed before it (so nothing sits under a symlink or a file);
- a hard link names a regular file listed before it;
- modes are permission bits and the sticky bit; set-id bits are never kept;
- a symlink's target is kept as written, whatever it points to: nothing on the
  host ever follows it (see ``_archive``).

Names travel in JSON as the ``surrogateescape`` decoding of their bytes with
``ensure_ascii``, which is one exact text per byte string.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

import attrs

from ...errors import SnapshotError

__all__ = ["FORMAT_VERSION", "Entry", "EntryKind", "Manifest", "check_name"]

#: The saved form's version; a reader refuses any other.
FORMAT_VERSION = 1

#: Linux's bounds on a path and on one of its components (PATH_MAX, NAME_MAX).
MAX_NAME_BYTES = 4096
MAX_COMPONENT_BYTES = 255
#: The permission bits and the sticky bit; set-uid and set-gid are never kept.
KEPT_MODE_BITS = 0o1777
SETID_BITS = 0o6000

_DIGEST = re.compile(r"[0-9a-f]{64}")


class EntryKind(enum.Enum):
    """What an entry is; a snapshot keeps no other kind of file."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"


def check_name(name: bytes) -> str | None:  # noqa: PLR0911 - one verdict per rule
    """Say why ``name`` cannot be an entry's name, or None when it can."""
    if not name:
        return "an empty name"
    if len(name) > MAX_NAME_BYTES:
        return f"a name longer than {MAX_NAME_BYTES} bytes"
    if b"\0" in name:
        return "a NUL byte in the name"
    if name.startswith(b"/"):
        return "an absolute name"
    for part in name.split(b"/"):
        if not part:
            return "an empty component"
        if part in (b".", b".."):
            return f"a {part.decode()!r} component"
        if len(part) > MAX_COMPONENT_BYTES:
            return f"a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def show(name: bytes) -> str:
    """A name as the messages show it: its text, with any byte that is not UTF-8 escaped."""
    return repr(name.decode("utf-8", "backslashreplace"))


def _check_entry(entry: Entry) -> None:
    if not (
        type(entry.name) is bytes
        and type(entry.kind) is EntryKind
        and type(entry.mode) is int
        and type(entry.size) is int
        and (entry.target is None or type(entry.target) is bytes)
        and (entry.digest is None or type(entry.digest) is str)
    ):
        raise TypeError(
            "Entry takes name: bytes, kind: EntryKind, mode: int, size: int, "
            f"target: bytes | None, digest: str | None; got {entry!r}"
        )
    problem = _entry_problem(entry)
    if problem is not None:
        raise SnapshotError(f"entry {show(entry.name)}: {problem}")


def _entry_problem(entry: Entry) -> str | None:  # noqa: PLR0911 - one verdict per rule
    problem = check_name(entry.name)
    if problem is not None:
        return problem
    if entry.mode & ~KEPT_MODE_BITS or entry.mode < 0:
        return f"mode {entry.mode:#o} has bits a snapshot does not keep"
    if entry.size < 0:
        return f"a negative size ({entry.size})"
    kind = entry.kind
    if (entry.digest is not None) != (kind is EntryKind.FILE):
        return "a digest is for regular files only, and every regular file has one"
    if entry.digest is not None and not _DIGEST.fullmatch(entry.digest):
        return "a digest that is not 64 lowercase hex digits"
    if kind is not EntryKind.FILE and entry.size:
        return f"a {kind.value} with a size"
    linked = kind in (EntryKind.SYMLINK, EntryKind.HARDLINK)
    if (entry.target is not None) != linked:
        return "a target is for links only, and every link has one"
    target = entry.target or b""
    if kind is EntryKind.SYMLINK and (
        not target or b"\0" in target or len(target) > MAX_NAME_BYTES
    ):
        return "a symlink target that is empty, has a NUL byte or is too long"
    if kind is EntryKind.HARDLINK:
        target_problem = check_name(target)
        if target_problem is not None:
            return f"a hard link to {target_problem}"
    return None


@attrs.frozen(kw_only=True)
class Entry:
    """One name in a snapshot: a regular file, a folder, a symlink or a hard link."""

    # One check of every field after construction (``_check_entry``), not a validator per
    # field: a restore builds one entry per file, and six validators cost more than the rest.
    name: bytes
    kind: EntryKind
    mode: int
    #: A regular file's bytes (sparse files count their holes); 0 for every other kind.
    size: int = 0
    #: A symlink's target as written, or the earlier file's name a hard link shares.
    target: bytes | None = None
    #: The sha256 of a regular file's bytes, in lowercase hex.
    digest: str | None = None

    def __attrs_post_init__(self) -> None:
        _check_entry(self)

    def with_digest(self, digest: str) -> Entry:
        """This regular file's entry with ``digest``; its other fields were checked already."""
        if self.kind is not EntryKind.FILE or type(digest) is not str:
            raise TypeError(f"with_digest takes a regular file's entry and a str, not {self!r}")
        if not _DIGEST.fullmatch(digest):
            raise SnapshotError(f"entry {show(self.name)}: a digest that is not 64 hex digits")
        # One check of the new field, not the six of a construction: a capture gives every
        # file of a tree its digest once its bytes are in.
        clone: Entry = object.__new__(Entry)
        for field in ("name", "kind", "mode", "size", "target"):
            object.__setattr__(clone, field, getattr(self, field))
        object.__setattr__(clone, "digest", digest)
        return clone

    def to_obj(self) -> dict[str, Any]:
        """The entry as its canonical JSON object."""
        return {
            "digest": self.digest,
            "kind": _KIND_TEXT[self.kind],
            "mode": self.mode,
            "name": _text(self.name),
            "size": self.size,
            "target": None if self.target is None else _text(self.target),
        }

    @classmethod
    def from_obj(cls, obj: object) -> Entry:
        """The entry a JSON object describes; SnapshotError for any key or value out of place."""
        if not isinstance(obj, dict) or set(obj) != _ENTRY_KEYS:
            raise SnapshotError(
                f"manifest: an entry is not an object with keys {sorted(_ENTRY_KEYS)}"
            )
        name, target, kind = obj["name"], obj["target"], obj["kind"]
        if not isinstance(name, str) or not (target is None or isinstance(target, str)):
            raise SnapshotError("manifest: an entry's name or target is not a string")
        if kind not in _KINDS:
            raise SnapshotError(f"manifest: an entry of unknown kind {kind!r}")
        for key in ("mode", "size"):
            if type(obj[key]) is not int:  # bool is an int, and no mode
                raise SnapshotError(f"manifest: an entry's {key} is not an integer")
        return cls(
            name=_bytes(name),
            kind=_KINDS[kind],
            mode=obj["mode"],
            size=obj["size"],
            target=None if target is None else _bytes(target),
            digest=obj["digest"],
        )


_ENTRY_KEYS = frozenset({"digest", "kind", "mode", "name", "size", "target"})
_KINDS = {kind.value: kind for kind in EntryKind}
_KIND_TEXT = {kind: kind.value for kind in EntryKind}
_MANIFEST_KEYS = frozenset(
    {"content_id", "entries", "file_count", "format_version", "notes", "total_bytes"}
)


def _text(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise SnapshotError(f"manifest: a name that is no byte string: {text!r}") from None


def _dumps(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode()


def _check_manifest(manifest: Manifest) -> None:
    if manifest.format_version != FORMAT_VERSION:
        raise SnapshotError(
            f"manifest: format version {manifest.format_version!r}, "
            f"this library reads {FORMAT_VERSION}"
        )
    folders: set[bytes] = set()
    files: set[bytes] = set()
    previous = b""
    total = 0
    for entry in manifest.entries:
        name = entry.name
        if name <= previous:
            raise SnapshotError(
                f"manifest: entry {show(name)} is out of order or named twice "
                f"(after {show(previous)})"
            )
        previous = name
        parent, slash, _ = name.rpartition(b"/")
        if slash and parent not in folders:
            raise SnapshotError(
                f"manifest: entry {show(name)} is not under a folder listed before it"
            )
        kind = entry.kind
        if kind is EntryKind.DIR:
            folders.add(name)
        elif kind is EntryKind.FILE:
            files.add(name)
            total += entry.size
        elif kind is EntryKind.HARDLINK and entry.target not in files:
            raise SnapshotError(
                f"manifest: hard link {show(name)} names {show(entry.target or b'')}, "
                "which is not a regular file listed before it"
            )
    if manifest.total_bytes != total:
        raise SnapshotError(
            f"manifest: total_bytes {manifest.total_bytes} but the files hold {total}"
        )
    if manifest.file_count != len(manifest.entries):
        raise SnapshotError(
            f"manifest: file_count {manifest.file_count} but {len(manifest.entries)} entries"
        )


@attrs.frozen(kw_only=True)
class Manifest:
    """A snapshot's entries in canonical order, their totals, and the notes of what was changed.

    ``file_count`` counts entries of every kind (each is one name on disk);
    ``total_bytes`` sums the regular files' sizes (a hard link adds nothing).
    ``content_id`` depends on the entries only: two trees with the same names,
    kinds, modes, links and bytes have the same id, whenever and wherever saved.
    """

    format_version: int = attrs.field(default=FORMAT_VERSION)
    entries: tuple[Entry, ...] = attrs.field(
        validator=attrs.validators.deep_iterable(
            attrs.validators.instance_of(Entry), attrs.validators.instance_of(tuple)
        )
    )
    total_bytes: int = attrs.field(validator=attrs.validators.instance_of(int))
    file_count: int = attrs.field(validator=attrs.validators.instance_of(int))
    notes: tuple[str, ...] = attrs.field(
        default=(),
        validator=attrs.validators.deep_iterable(
            attrs.validators.instance_of(str), attrs.validators.instance_of(tuple)
        ),
    )
    # The entries' canonical JSON, made once: the content id hashes it, to_json holds it.
    _entries_json: bytes = attrs.field(init=False, repr=False, eq=False, hash=False)
    _content_id: str = attrs.field(init=False, repr=False, eq=False, hash=False)

    def __attrs_post_init__(self) -> None:
        _check_manifest(self)
        entries_json = _dumps([entry.to_obj() for entry in self.entries])
        object.__setattr__(self, "_entries_json", entries_json)
        object.__setattr__(
            self, "_content_id", "sha256:" + hashlib.sha256(entries_json).hexdigest()
        )

    @classmethod
    def build(cls, entries: Iterable[Entry], notes: Iterable[str] = ()) -> Manifest:
        """The manifest of these entries (any order), its totals counted."""
        ordered = tuple(sorted(entries, key=lambda entry: entry.name))
        return cls(
            entries=ordered,
            total_bytes=sum(entry.size for entry in ordered),
            file_count=len(ordered),
            notes=tuple(notes),
        )

    @property
    def content_id(self) -> str:
        """``sha256:`` and the hash of the entries' canonical JSON."""
        return self._content_id

    def to_json(self) -> bytes:
        """The manifest's canonical JSON (sorted keys, no spaces, ASCII only)."""
        # The keys in sorted order, as _dumps would write them, around the entries' JSON.
        return b"".join(
            (
                b'{"content_id":',
                _dumps(self.content_id),
                b',"entries":',
                self._entries_json,
                b',"file_count":',
                _dumps(self.file_count),
                b',"format_version":',
                _dumps(self.format_version),
                b',"notes":',
                _dumps(list(self.notes)),
                b',"total_bytes":',
                _dumps(self.total_bytes),
                b"}",
            )
        )

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """The manifest ``data`` holds, refused unless it is canonical and its content id agrees."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise SnapshotError(f"manifest: not JSON ({exc})") from None
        if not isinstance(obj, dict) or set(obj) != _MANIFEST_KEYS:
            raise SnapshotError(f"manifest: not an object with keys {sorted(_MANIFEST_KEYS)}")
        entries, notes = obj["entries"], obj["notes"]
        if not isinstance(entries, list) or not isinstance(notes, list):
            raise SnapshotError("manifest: entries or notes is not a list")
        for key in ("total_bytes", "file_count"):
            if type(obj[key]) is not int:  # bool is an int, and no count
                raise SnapshotError(f"manifest: {key} is not an integer")
        try:
            manifest = cls(
                format_version=obj["format_version"],
                entries=tuple(Entry.from_obj(entry) for entry in entries),
                total_bytes=obj["total_bytes"],
                file_count=obj["file_count"],
                notes=tuple(notes),
            )
        except TypeError as exc:  # a note that is not a string
            raise SnapshotError(f"manifest: {exc}") from None
        if manifest.content_id != obj["content_id"]:
            raise SnapshotError(
                f"manifest: content id {obj['content_id']!r} but its entries hash to "
                f"{manifest.content_id!r} (tampered)"
            )
        if manifest.to_json() != data:
            raise SnapshotError("manifest: not in canonical form (rewritten or tampered)")
        return manifest
