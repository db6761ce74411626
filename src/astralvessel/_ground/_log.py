"""The library's loggers, one per concern, and the one way an event is logged.

Every logger is under ``astralvessel.``, whose ``NullHandler`` (set in
``__init__``) keeps the library silent until the host configures logging.
An event is one line of ``key=value`` pairs, and the same pairs ride on the
record as ``record.astralvessel`` (a dict) for structured handlers. Only
names, sizes, durations and outcomes are logged at INFO and above; argument
contents and output never are (a host's data is not the log's to keep).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

__all__ = [
    "CALLS",
    "EXEC",
    "NETWORK",
    "RAY",
    "REFUSALS",
    "SANDBOX",
    "SNAPSHOTS",
    "TURN",
    "WARM",
    "WARNING",
    "event",
]

#: The level of events that say something went wrong (a sandbox lost, a start failed).
WARNING = logging.WARNING

#: Turns opened and closed.
TURN = logging.getLogger("astralvessel.turn")
#: Each tool call, with its tool, duration, outcome and sizes.
CALLS = logging.getLogger("astralvessel.calls")
#: The host's commands and file operations (``Turn.exec``, ``read_file``...).
EXEC = logging.getLogger("astralvessel.exec")
#: Calls refused before anything ran (unknown tool, arguments, scopes).
REFUSALS = logging.getLogger("astralvessel.refusals")
#: Sandboxes started, died and restarted.
SANDBOX = logging.getLogger("astralvessel.sandbox")
#: The warm pool's refills.
WARM = logging.getLogger("astralvessel.warm")
#: Each connection the egress proxy refused (host, port, reason), or turned away.
NETWORK = logging.getLogger("astralvessel.network")
#: Snapshot trees whose removal failed (the folder is left for the next host's sweep).
SNAPSHOTS = logging.getLogger("astralvessel.snapshots")
#: Where Ray placed each turn.
RAY = logging.getLogger("astralvessel.ray")


def _shown(value: object) -> str:
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    # A value with spaces is quoted, so a line stays one ``key=value`` per field.
    return repr(text) if not text or any(c.isspace() for c in text) else text


def event(
    logger: logging.Logger, name: str, fields: Mapping[str, object], level: int = logging.INFO
) -> None:
    """Log the event ``name`` with ``fields``: as ``key=value`` text and as a dict."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{key}={_shown(value)}" for key, value in fields.items())
    logger.log(level, "%s %s", name, text, extra={"astralvessel": {"event": name, **fields}})
