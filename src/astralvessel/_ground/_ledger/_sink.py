"""Where a turn's records go: ``Ledger`` (the host's choice) and ``LedgerSink`` (one turn's)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ...errors import UsageError

__all__ = ["Ledger", "LedgerSink"]

#: A record as the redaction hook and a callable target see it.
Record = dict[str, Any]


def _target(value: object) -> Path | Callable[[Record], object]:
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    if callable(value):
        return value
    raise UsageError(
        f"ledger is a folder, a file path, a callable or a Ledger, not {type(value).__name__}"
    )


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 64:
        raise UsageError(f"Ledger.{attribute.name} is an int of at least 64, not {value!r}")


@attrs.frozen(kw_only=True)
class Ledger:
    """Where each turn's records are written, and what the host removes from them first.

    ``target`` is a folder (one ``TURN-ID.jsonl`` per turn), a file (every turn's
    records appended to it) or a callable given each record as a dict. ``redact``,
    when given, sees each record before it is written and returns the record to
    write (changed or not) or None to drop it. ``max_chars`` bounds each argument
    set and text kept in a record; a longer one is cut with a marker and its sha256.
    """

    target: Path | Callable[[Record], object] = attrs.field(converter=_target)
    redact: Callable[[Record], Record | None] | None = None
    max_chars: int = attrs.field(default=8192, validator=_positive)

    @classmethod
    def of(cls, value: object) -> Ledger | None:
        """``Executor(ledger=)``'s value as a ``Ledger`` (None stays None)."""
        if value is None or isinstance(value, Ledger):
            return value
        return cls(target=value)

    def open(self, turn_id: str) -> LedgerSink:
        """The sink of one turn's records."""
        target = self.target
        if not isinstance(target, Path):
            return LedgerSink(self, write=lambda line, record: target(record))
        path = target / f"{turn_id}.jsonl" if target.is_dir() else target
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise UsageError(f"ledger: cannot open {path} for writing ({exc})") from None
        return LedgerSink(self, fd=fd)


class LedgerSink:
    """One turn's records on their way: redacted, then written whole, one line each."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        fd: int | None = None,
        write: Callable[[bytes, Record], object] | None = None,
    ) -> None:
        self.ledger = ledger
        self._fd = fd
        self._write = write
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        """Redact ``record`` and write it as one line (one ``write``: whole or not at all)."""
        redact = self.ledger.redact
        kept: Record | None = dict(record)
        if redact is not None and kept is not None:
            kept = redact(kept)
        if kept is None:
            return
        line = (json.dumps(kept, ensure_ascii=False, default=str) + "\n").encode()
        with self._lock:
            if self._write is not None:
                self._write(line, kept)
            elif self._fd is not None:
                # O_APPEND and one write: turns sharing a file never interleave inside a line,
                # and a host killed mid-turn leaves every record before the last one whole.
                os.write(self._fd, line)

    def close(self) -> None:
        """Sync the file to disk and close it; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
