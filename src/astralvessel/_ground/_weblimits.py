"""The web tools' limits: what ``web/`` enforces by default and the built-ins' descriptions quote.

One definition each, below both: ``web/_fetch.py``'s ``FetchLimits`` and
``web/_search.py``'s ``Searcher`` enforce them, and ``builtins.py`` formats its
``webfetch`` and ``websearch`` descriptions from them, without loading the web
package (and ``ssl``) to do so.
"""

from __future__ import annotations

__all__ = [
    "FETCH_MAX_BYTES",
    "FETCH_MAX_HEADER_BYTES",
    "FETCH_MAX_REDIRECTS",
    "FETCH_TIMEOUT_SECONDS",
    "SEARCH_DEFAULT_RESULTS",
    "SEARCH_MAX_RESULTS",
    "format_size",
]

#: The bytes of one page read, after decompression.
FETCH_MAX_BYTES = 4 * 1024 * 1024
#: The seconds one fetch may take, every redirect included.
FETCH_TIMEOUT_SECONDS = 30.0
#: The redirects one fetch follows.
FETCH_MAX_REDIRECTS = 5
#: The bytes of one response's head.
FETCH_MAX_HEADER_BYTES = 65536
#: The results a search returns when the call does not say.
SEARCH_DEFAULT_RESULTS = 8
#: The most results a search returns.
SEARCH_MAX_RESULTS = 20


def format_size(limit: int) -> str:
    """``4 MB`` for 4 MiB, ``1000 bytes`` otherwise: how a byte limit is named to the model."""
    if limit % (1024 * 1024) == 0:
        return f"{limit // (1024 * 1024)} MB"
    return f"{limit} bytes"
