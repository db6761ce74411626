"""The turn ledger: one JSON-lines record per event of a turn, for audit and replay.

``_records`` builds the records (pure: bounds, hashes, the schema); ``_sink``
writes them (a folder with one file per turn, one file, or a callable), each
record whole and flushed, the file synced at close. See ``docs/observing.md``.
"""

from __future__ import annotations

from ._records import SCHEMA_VERSION, bounded, read_ledger
from ._sink import Ledger, LedgerSink

__all__ = ["SCHEMA_VERSION", "Ledger", "LedgerSink", "bounded", "read_ledger"]
