"""Why webfetch or websearch failed, and the one wording of each reason.

``web/`` decides by code: a body it cannot read is a ``ContentRefusal``, a
failed fetch a ``FetchFailed``, a search that did not run or failed a
``SearchFailed`` (each a code and the facts its words name, in ``errors``).
``WebResult.text``, ``SearchError``'s and ``ContentRefused``'s messages are
public (a host may use ``Fetcher`` or ``Searcher`` without an executor) and
``results.render_page`` words the model's result from ``WebResult.failed``:
both import this module, in the ground below them, so each reason has one
wording. Pure values, no I/O.
"""

from __future__ import annotations

import attrs

from ..errors import (
    ContentRefusal,
    ContentWhy,
    FetchFailed,
    FetchWhy,
    SearchFailed,
    SearchWhy,
)
from ._weblimits import SEARCH_MAX_RESULTS

__all__ = [
    "content_words",
    "failure_words",
    "fetch_failure_words",
    "search_failure_words",
    "search_reason",
]

_CONTENT: dict[ContentWhy, str] = {
    ContentWhy.COMPRESSED_TWICE: "the response is compressed more than once ({given})",
    ContentWhy.ENCODING: "the response uses the unsupported content encoding {given!r}",
    ContentWhy.CORRUPT: "the {given} compressed body is corrupt ({detail})",
    ContentWhy.NOT_TEXT: (
        "the page is {given}, which webfetch does not turn into text "
        "(it reads HTML, plain text, markdown and JSON)"
    ),
    ContentWhy.BINARY: "the page says it is {given} but its content is binary",
}

_FETCH: dict[FetchWhy, str] = {
    FetchWhy.TIMEOUT: (
        "webfetch gave up on {url}: it did not finish within {seconds:g} s. "
        "The site may be slow or down; try again later or try another page."
    ),
    FetchWhy.UNREACHABLE: "webfetch could not fetch {url}: {detail}.",
    FetchWhy.UNRESOLVED: (
        "webfetch could not resolve {host} ({detail}); check the spelling of the host name"
    ),
    FetchWhy.REDIRECTS: "webfetch stopped after {count} redirects; the last one pointed to {url}",
    FetchWhy.UNREADABLE: "webfetch could not read {url}: {content}.",
}

#: What a search that failed says after its reason: a failed search is not "nothing exists".
_NOT_NOTHING = (
    "This does not mean nothing exists on the web about this; the search itself did not "
    "work. Try again, rephrase the query, or use webfetch on a page you know."
)

# The sentences of the codes that are not a failed search's reason.
_SEARCH: dict[SearchWhy, str] = {
    SearchWhy.NO_QUERY: "websearch needs a non-empty query.",
    SearchWhy.RESULT_COUNT: (
        f"max_results must be a whole number from 1 to {SEARCH_MAX_RESULTS}; got {{given}}."
    ),
    SearchWhy.NOT_CONFIGURED: (
        "Error: websearch is not set up in this deployment, so no search ran. This does not "
        "mean nothing exists; answer from what you know or other tools, and say you could "
        "not search."
    ),
}

# The reason a search failed, which SearchError's message is.
_REASONS: dict[SearchWhy, str] = {
    SearchWhy.TIMEOUT: "the search service did not answer in time",
    SearchWhy.UNREACHABLE: "the search service could not be reached ({detail})",
    SearchWhy.UNREADABLE: "the search service could not be reached ({content})",
    SearchWhy.SERVICE: "{detail}",
    SearchWhy.UNRESOLVED: "the search service's host {host} does not resolve ({detail})",
    SearchWhy.NO_ADDRESSES: "the search service's host {host} does not resolve (no addresses)",
    SearchWhy.HTTP_STATUS: "the search service answered HTTP {status}",
    SearchWhy.NOT_JSON: "the search service sent something other than JSON ({media})",
    SearchWhy.SEARXNG_ANSWER: "the SearXNG instance's answer has no 'results' list",
    SearchWhy.BRAVE_ANSWER: "the Brave API's answer has no web results list",
    SearchWhy.NO_WORDS: "the query has no words to look for",
    SearchWhy.LOCAL_INDEX: "the local index failed ({detail})",
}


def content_words(refusal: ContentRefusal) -> str:
    """Why a body was not read: ``ContentRefused``'s message, inside the tools' words."""
    return _CONTENT[refusal.why].format(given=refusal.given, detail=refusal.detail)


def _content(refusal: ContentRefusal | None) -> str:
    return "" if refusal is None else content_words(refusal)


def fetch_failure_words(failed: FetchFailed) -> str:
    """The words of a failed fetch: ``WebResult.text`` and the model's result alike."""
    facts = attrs.asdict(failed, recurse=False) | {"content": _content(failed.content)}
    return _FETCH[failed.why].format(**facts)


def search_reason(failed: SearchFailed) -> str:
    """Why a search failed, in a clause: ``SearchError``'s message."""
    facts = attrs.asdict(failed, recurse=False) | {
        "content": _content(failed.content),
        "media": failed.given or "no type",
    }
    return _REASONS[failed.why].format(**facts)


def search_failure_words(failed: SearchFailed) -> str:
    """The words of a search that did not run or failed: ``WebResult.text`` and the result."""
    if failed.why in _SEARCH:
        return _SEARCH[failed.why].format(given=failed.given)
    return f"websearch failed: {search_reason(failed)}. {_NOT_NOTHING}"


def failure_words(failed: FetchFailed | SearchFailed) -> str:
    """The words of either tool's failure."""
    if isinstance(failed, FetchFailed):
        return fetch_failure_words(failed)
    return search_failure_words(failed)
