"""What one ledger record holds: the schema, bounded texts and values, and reading a file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CUT", "SCHEMA_VERSION", "bounded", "digest", "read_ledger"]

#: The first record's ``schema``; a reader refuses a version it does not know.
SCHEMA_VERSION = 1
#: The key of a value cut to its bound: ``{"$cut": prefix, "chars": N, "sha256": HEX}``.
CUT = "$cut"


def digest(data: bytes | str) -> str:
    """The sha256 of ``data`` (text as UTF-8), in hex."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def bounded(value: Any, limit: int) -> Any:
    """``value`` as is when its JSON text fits ``limit`` characters, else cut with a marker.

    A cut value keeps its first ``limit`` characters (of the text, or of the JSON of
    anything else), how many there were, and the full sha256, so a reader can tell
    two cut values apart and check one it holds whole.
    """
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) <= limit:
        return value
    return {CUT: text[:limit], "chars": len(text), "sha256": digest(text)}


def read_ledger(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a ledger file, in order; a last line cut by a killed host is skipped."""
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            if not line.endswith("\n"):
                return  # the host died while writing it: every whole line before it stands
            record = json.loads(line)
            if record.get("event") == "turn" and record.get("schema") != SCHEMA_VERSION:
                raise ValueError(
                    f"{path}: ledger schema {record.get('schema')!r}; this version reads "
                    f"{SCHEMA_VERSION}"
                )
            yield record
