"""The one check of a timeout the host gives in code: ``Executor``, ``Turn.exec``, a tool's.

Each once had its own copy, and one let NaN, infinity or text through.
"""

from __future__ import annotations

import math

from ..errors import UsageError

__all__ = ["MAX_TIMEOUT", "check_seconds"]

#: The longest timeout the host may give (seconds): a day.
MAX_TIMEOUT = 24 * 3600.0


def check_seconds(name: str, value: object) -> float:
    """``value`` as a float of seconds.

    Raises ``UsageError`` naming ``name`` unless it is a number (not a bool), finite,
    above 0 and at most ``MAX_TIMEOUT``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number of seconds, not {value!r}")
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise UsageError(f"{name} must be above 0 and at most {MAX_TIMEOUT:g} s, not {value!r}")
    return float(value)
