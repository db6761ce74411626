"""`LocalIndexProvider`: `websearch` over a folder of documents, for offline deployments.

SQLite FTS5 indexes text, markdown, reStructuredText, JSON and HTML files
(HTML reduced to text by the same converter `webfetch` uses); the index is
refreshed before each search when files changed.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from .._ground._aio import to_thread
from ..errors import SearchFailed, SearchWhy, UsageError
from ._content import ContentRefused, render
from ._search import SearchHit, search_error

__all__ = ["LocalIndexProvider"]

_INDEXED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".rst", ".json")
_WORD = re.compile(r"\w+", re.UNICODE)


class LocalIndexProvider:
    """Full-text search over a folder of documents with SQLite FTS5, for offline deployments.

    Text, markdown, reStructuredText, JSON and HTML files are indexed (HTML
    reduced to text first); the index is refreshed before each search when
    files changed. ``database`` keeps the index on disk between runs;
    ``base_url`` turns a file's relative path into its link, for a folder
    that mirrors a site.
    """

    name = "local"

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        database: str | os.PathLike[str] | None = None,
        base_url: str | None = None,
    ) -> None:
        self.folder = Path(folder).resolve()
        if not self.folder.is_dir():
            raise UsageError(f"local search folder {self.folder} does not exist or is not a folder")
        self.base_url = base_url
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(database) if database else ":memory:", check_same_thread=False
        )
        with self._db:
            self._db.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS docs"
                " USING fts5(path UNINDEXED, title, body, tokenize='unicode61')"
            )
            self._db.execute("CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, stamp TEXT)")
        self._signature: str | None = None

    def __enter__(self) -> LocalIndexProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the index database."""
        self._db.close()

    def _scan(self) -> dict[str, tuple[Path, str]]:
        found: dict[str, tuple[Path, str]] = {}
        for path in sorted(self.folder.rglob("*")):
            if (
                path.suffix.lower() not in _INDEXED_SUFFIXES
                or not path.is_file()
                or path.is_symlink()
            ):
                continue
            stat = path.stat()
            found[path.relative_to(self.folder).as_posix()] = (
                path,
                f"{stat.st_mtime_ns}:{stat.st_size}",
            )
        return found

    def refresh(self) -> int:
        """Bring the index up to date with the folder; return how many files were (re)indexed."""
        with self._lock:
            found = self._scan()
            signature = hashlib.sha256(
                repr(sorted((k, v[1]) for k, v in found.items())).encode()
            ).hexdigest()
            if signature == self._signature:
                return 0
            known = dict(self._db.execute("SELECT path, stamp FROM files").fetchall())
            changed = 0
            with self._db:
                for gone in set(known) - set(found):
                    self._db.execute("DELETE FROM docs WHERE path = ?", (gone,))
                    self._db.execute("DELETE FROM files WHERE path = ?", (gone,))
                for relative, (path, stamp) in found.items():
                    if known.get(relative) == stamp:
                        continue
                    title, body = _document(path, relative)
                    self._db.execute("DELETE FROM docs WHERE path = ?", (relative,))
                    self._db.execute(
                        "INSERT INTO docs (path, title, body) VALUES (?, ?, ?)",
                        (relative, title, body),
                    )
                    self._db.execute(
                        "INSERT OR REPLACE INTO files (path, stamp) VALUES (?, ?)",
                        (relative, stamp),
                    )
                    changed += 1
            self._signature = signature
            return changed

    def search(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """Rank documents by BM25 for any of the query's words."""
        words = _WORD.findall(query)
        if not words:
            raise search_error(SearchFailed(why=SearchWhy.NO_WORDS))
        # Each word is quoted, so FTS5 query syntax in the model's text is only ever text.
        match = " OR ".join('"' + word.replace('"', "") + '"' for word in words[:32])
        self.refresh()
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT path, title, snippet(docs, 2, '', '', ' … ', 24) FROM docs "
                    "WHERE docs MATCH ? ORDER BY bm25(docs, 0.0, 5.0, 1.0) LIMIT ?",
                    (match, max_results),
                ).fetchall()
            except sqlite3.Error as error:
                raise search_error(
                    SearchFailed(why=SearchWhy.LOCAL_INDEX, detail=str(error))
                ) from None
        return [
            SearchHit(title=title, url=self._link(path), snippet=snippet.strip())
            for path, title, snippet in rows
        ]

    async def asearch(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """Search in a worker thread, so the event loop keeps running."""
        return await to_thread(self.search, query, max_results)

    def _link(self, relative: str) -> str:
        if self.base_url:
            return self.base_url.rstrip("/") + "/" + relative
        return relative


def _document(path: Path, relative: str) -> tuple[str, str]:
    raw = path.read_bytes()[: 4 * 1024 * 1024]
    suffix = path.suffix.lower()
    try:
        text = render(
            raw,
            "text/html" if suffix in (".html", ".htm") else "text/plain; charset=utf-8",
            relative,
        )
    except ContentRefused:
        return relative, ""
    title = relative
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped:
            title = stripped[:200]
            break
    return title, text
