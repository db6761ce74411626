"""`websearch`: a `Searcher` over a `SearchProvider` the deployment chooses.

Providers: `SearxngProvider` (a SearXNG instance's JSON API),
`BraveProvider` (the Brave Search API) and, in ``_local.py``, `LocalIndexProvider`
(SQLite FTS5 over a folder of documents, for offline deployments). A provider returns
`SearchHit` values or raises `SearchError`; the `Searcher` fences the hits
for the model and turns every failure into an error result that says a
failed search does not mean nothing exists.

The endpoints of SearXNG and Brave are the operator's configuration, not
the model's, so they are reached directly through the provider's transport
(a SearXNG instance often lives on a private address on purpose).
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable
from urllib.parse import urlencode, urlsplit

import attrs

from .._ground._webfailures import search_reason
from .._ground._weblimits import SEARCH_DEFAULT_RESULTS, SEARCH_MAX_RESULTS
from .._ground._webwords import NO_RESULTS, UNTITLED
from ..errors import SearchError, SearchFailed, SearchWhy, UsageError
from ._content import BodyCollector, ContentRefused, Fenced, parse_content_type
from ._egress import SystemResolver
from ._exchange import AsyncExchangeIO, Close, ExchangeIO, Resolve, Send, read_body
from ._fetch import WebResult
from ._flow import Flow, Step, arun, run
from ._stdlib import StdlibTransport
from ._transport import HttpRequest, Transport

__all__ = [
    "DEFAULT_MAX_RESULTS",
    "MAX_RESULTS",
    "BraveProvider",
    "SearchError",
    "SearchHit",
    "SearchProvider",
    "Searcher",
    "SearxngProvider",
]

DEFAULT_MAX_RESULTS = SEARCH_DEFAULT_RESULTS
MAX_RESULTS = SEARCH_MAX_RESULTS
_RESPONSE_LIMIT = 2 * 1024 * 1024
_TAGS = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")


@attrs.frozen(kw_only=True)
class SearchHit:
    """One result: a title, a link and a short snippet."""

    title: str
    url: str
    snippet: str = ""


@runtime_checkable
class SearchProvider(Protocol):
    """Where search results come from. ``search`` raises `SearchError` when it cannot answer."""

    name: str

    def search(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """Return at most ``max_results`` hits, best first."""
        ...

    async def asearch(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """The async twin of ``search``."""
        ...


def search_error(failed: SearchFailed) -> SearchError:
    """A provider's `SearchError` for ``failed``: its message is the code's reason."""
    return SearchError(search_reason(failed), failed=failed)


def _clean(text: str) -> str:
    return _SPACES.sub(" ", html.unescape(_TAGS.sub("", text))).strip()


class Searcher:
    """Runs `websearch` calls against one provider and formats what the model sees."""

    def __init__(self, provider: SearchProvider) -> None:
        self.provider = provider

    def _check(self, query: str, max_results: int | None) -> tuple[str, int] | SearchFailed:
        if not isinstance(query, str) or not query.strip():
            return SearchFailed(why=SearchWhy.NO_QUERY)
        count = DEFAULT_MAX_RESULTS if max_results is None else max_results
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
            return SearchFailed(why=SearchWhy.RESULT_COUNT, given=repr(max_results))
        return query.strip(), count

    def _format(self, query: str, hits: Sequence[SearchHit], count: int) -> WebResult:
        lines: list[str] = []
        for number, hit in enumerate(hits[:count], start=1):
            lines.append(f"{number}. {_clean(hit.title) or UNTITLED}")
            lines.append(f"   {hit.url}")
            snippet = _clean(hit.snippet)
            if snippet:
                lines.append(f"   {snippet}")
            lines.append("")
        body = "\n".join(lines) if lines else NO_RESULTS
        fenced = Fenced.of(f"{self.provider.name} search: {query}", body)
        return WebResult(text=fenced.text, fenced=fenced, is_error=False)

    def search(self, query: str, max_results: int | None = None) -> WebResult:
        """Search and return fenced results, or an error result that says the search failed."""
        provider = self.provider
        return run(
            self._flow(query, max_results),
            {_Ask: lambda step: provider.search(step.query, step.count)},
        )

    async def asearch(self, query: str, max_results: int | None = None) -> WebResult:
        """The async twin of `search`: the same flow, the provider awaited."""
        provider = self.provider
        return await arun(
            self._flow(query, max_results),
            {_Ask: lambda step: provider.asearch(step.query, step.count)},
        )

    def _flow(self, query: str, max_results: int | None) -> Flow[WebResult]:
        checked = self._check(query, max_results)
        if isinstance(checked, SearchFailed):
            return WebResult.failure(checked, refused=True)
        text, count = checked
        try:
            hits = yield from _Ask(text, count)
        except (SearchError, OSError, ContentRefused, asyncio.TimeoutError) as error:
            return WebResult.failure(_failed(error))
        return self._format(text, hits, count)


@attrs.frozen
class _Ask(Step[Sequence[SearchHit]]):
    """Ask the provider for at most ``count`` hits."""

    query: str
    count: int


def _failed(error: BaseException) -> SearchFailed:
    """Why the provider failed with ``error``, by code."""
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return SearchFailed(why=SearchWhy.TIMEOUT)
    if isinstance(error, SearchError):
        if error.failed is not None:
            return error.failed
        return SearchFailed(why=SearchWhy.SERVICE, detail=str(error))
    if isinstance(error, ContentRefused):
        return SearchFailed(why=SearchWhy.UNREADABLE, content=error.refusal)
    detail = getattr(error, "strerror", None) or error
    return SearchFailed(why=SearchWhy.UNREACHABLE, detail=str(detail))


# -- HTTP providers ---------------------------------------------------------------------------


class _HttpProvider:
    """Shared plumbing: one GET to an operator-configured endpoint, JSON back."""

    name = "web"

    def __init__(
        self, endpoint: str, *, transport: Transport | None, timeout_seconds: float
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"search endpoint {endpoint!r} must be an http:// or https:// URL")
        self.endpoint = endpoint
        self.transport: Transport = transport if transport is not None else StdlibTransport()
        self.timeout_seconds = timeout_seconds
        self._resolver = SystemResolver()

    def _headers(self) -> tuple[tuple[str, str], ...]:
        return (("Accept", "application/json"), ("Accept-Encoding", "gzip, deflate"))

    def _params(self, query: str, max_results: int) -> dict[str, str]:
        raise NotImplementedError

    def _hits(self, data: object, max_results: int) -> list[SearchHit]:
        raise NotImplementedError

    def search(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """Ask the service once."""
        io = ExchangeIO(self.transport, self._resolver)
        return run(self._flow(query, max_results), io.perform)

    async def asearch(self, query: str, max_results: int) -> Sequence[SearchHit]:
        """Ask the service once, without blocking the event loop."""
        io = AsyncExchangeIO(self.transport, self._resolver)
        return await arun(self._flow(query, max_results), io.perform)

    def _flow(self, query: str, max_results: int) -> Flow[list[SearchHit]]:
        parts = urlsplit(self.endpoint)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        deadline = time.monotonic() + self.timeout_seconds
        try:
            addresses = yield from Resolve(host, port, deadline)
        except TimeoutError:
            raise
        except OSError as error:
            failed = SearchFailed(why=SearchWhy.UNRESOLVED, host=host, detail=str(error))
            raise search_error(failed) from None
        if not addresses:
            raise search_error(SearchFailed(why=SearchWhy.NO_ADDRESSES, host=host))
        query_string = urlencode(self._params(query, max_results))
        path = parts.path or "/"
        response = yield from Send(
            HttpRequest(
                method="GET",
                scheme=parts.scheme,
                host=host,
                address=addresses[0],
                port=port,
                target=f"{path}?{parts.query + '&' if parts.query else ''}{query_string}",
                headers=self._headers(),
                deadline=deadline,
            )
        )
        try:
            collector = _collector(response.headers)
            yield from read_body(collector, deadline)
        finally:
            yield from Close()
        return self._decode(response.status, response.headers, collector.body(), max_results)

    def _decode(
        self, status: int, headers: Sequence[tuple[str, str]], body: bytes, max_results: int
    ) -> list[SearchHit]:
        if status != 200:
            raise search_error(SearchFailed(why=SearchWhy.HTTP_STATUS, status=status))
        media, _ = parse_content_type(
            next((v for k, v in headers if k.lower() == "content-type"), None)
        )
        try:
            data = json.loads(body)
        except ValueError:
            raise search_error(SearchFailed(why=SearchWhy.NOT_JSON, given=media)) from None
        return self._hits(data, max_results)[:max_results]


def _collector(headers: Sequence[tuple[str, str]]) -> BodyCollector:
    encoding = ", ".join(v for k, v in headers if k.lower() == "content-encoding") or None
    return BodyCollector.for_encoding(encoding, _RESPONSE_LIMIT)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _hits_of(results: list[object], *, snippet: str) -> list[SearchHit]:
    """The hits of an answer's results list: the items with a URL, ``snippet`` their text's key."""
    return [
        SearchHit(
            title=_text(item.get("title")),
            url=_text(item.get("url")),
            snippet=_text(item.get(snippet)),
        )
        for item in results
        if isinstance(item, dict) and _text(item.get("url"))
    ]


class SearxngProvider(_HttpProvider):
    """Searches a SearXNG instance through its JSON API (``format=json`` must be enabled)."""

    name = "searxng"

    def __init__(
        self,
        base_url: str,
        *,
        transport: Transport | None = None,
        timeout_seconds: float = 15.0,
        categories: str = "general",
    ) -> None:
        endpoint = (
            base_url.rstrip("/") + "/search"
            if not base_url.rstrip("/").endswith("/search")
            else base_url
        )
        super().__init__(endpoint, transport=transport, timeout_seconds=timeout_seconds)
        self.categories = categories

    def _params(self, query: str, max_results: int) -> dict[str, str]:
        return {"q": query, "format": "json", "categories": self.categories}

    def _hits(self, data: object, max_results: int) -> list[SearchHit]:
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise search_error(SearchFailed(why=SearchWhy.SEARXNG_ANSWER))
        return _hits_of(results, snippet="content")


class BraveProvider(_HttpProvider):
    """Searches with the Brave Search API; needs the operator's subscription token."""

    name = "brave"

    def __init__(
        self,
        api_key: str,
        *,
        endpoint: str = "https://api.search.brave.com/res/v1/web/search",
        transport: Transport | None = None,
        timeout_seconds: float = 15.0,
    ) -> None:
        if not api_key:
            raise UsageError("BraveProvider needs an API key (the X-Subscription-Token value)")
        super().__init__(endpoint, transport=transport, timeout_seconds=timeout_seconds)
        self._api_key = api_key

    def _headers(self) -> tuple[tuple[str, str], ...]:
        return (*super()._headers(), ("X-Subscription-Token", self._api_key))

    def _params(self, query: str, max_results: int) -> dict[str, str]:
        return {"q": query, "count": str(max_results)}

    def _hits(self, data: object, max_results: int) -> list[SearchHit]:
        web = data.get("web") if isinstance(data, dict) else None
        if web is None and isinstance(data, dict) and "type" in data:
            return []  # an answer without web results: a real "nothing found"
        results = web.get("results") if isinstance(web, dict) else None
        if not isinstance(results, list):
            raise search_error(SearchFailed(why=SearchWhy.BRAVE_ANSWER))
        return _hits_of(results, snippet="description")
