"""The web tools' failures by code: every code worded once, the messages those words."""

from __future__ import annotations

import pickle

import pytest

from astralvessel._ground._webfailures import (
    content_words,
    failure_words,
    fetch_failure_words,
    search_failure_words,
    search_reason,
)
from astralvessel.errors import (
    ContentRefusal,
    ContentWhy,
    FetchFailed,
    FetchWhy,
    SearchError,
    SearchFailed,
    SearchWhy,
)
from astralvessel.web import Fetcher, FetchLimits, Searcher, SearchHit, WebResult
from astralvessel.web._content import BodyCollector, ContentRefused, render

from .conftest import MapResolver

NOT_NOTHING = "This does not mean nothing exists on the web about this"
CONTENT = ContentRefusal(why=ContentWhy.CORRUPT, given="gzip", detail="bad header")


@pytest.mark.parametrize("why", list(ContentWhy))
def test_every_content_code_is_worded_with_its_facts(why: ContentWhy) -> None:
    """Each content code is worded, names what it was given, and the error's message is it."""
    refusal = ContentRefusal(why=why, given="type/given", detail="zlib's words")
    words = content_words(refusal)
    assert "type/given" in words
    error = ContentRefused(refusal)
    assert (str(error), error.refusal) == (words, refusal)


@pytest.mark.parametrize("why", list(FetchWhy))
def test_every_fetch_code_is_worded(why: FetchWhy) -> None:
    """Each fetch code is worded from its facts, and a result of it carries the code."""
    failed = FetchFailed(
        why=why,
        url="https://x.test/p",
        host="x.test",
        detail="d",
        seconds=2.5,
        count=3,
        content=CONTENT,
    )
    words = fetch_failure_words(failed)
    assert words.startswith("webfetch ")
    assert ("x.test" if why is FetchWhy.UNRESOLVED else "https://x.test/p") in words
    result = WebResult.failure(failed, url="https://x.test/p")
    assert (result.text, result.is_error, result.failed) == (words, True, failed)
    assert failure_words(failed) == words


@pytest.mark.parametrize("why", list(SearchWhy))
def test_every_search_code_is_worded(why: SearchWhy) -> None:
    """Each search code is worded; a failed search says it is not "nothing exists"."""
    failed = SearchFailed(
        why=why, given="7", host="h.test", status=503, detail="d", content=CONTENT
    )
    words = search_failure_words(failed)
    stops = {SearchWhy.NO_QUERY, SearchWhy.RESULT_COUNT, SearchWhy.NOT_CONFIGURED}
    if why in stops:
        assert NOT_NOTHING not in words
    else:
        assert words.startswith(f"websearch failed: {search_reason(failed)}. ")
        assert NOT_NOTHING in words
    assert failure_words(failed) == words


def test_a_search_error_pickles_with_its_code() -> None:
    """A provider's SearchError keeps its code across processes, as EgressError does."""
    failed = SearchFailed(why=SearchWhy.HTTP_STATUS, status=429)
    sent = pickle.dumps(SearchError(search_reason(failed), failed=failed))
    error = pickle.loads(sent)  # noqa: S301 - our own bytes
    assert (str(error), error.failed) == ("the search service answered HTTP 429", failed)


def test_contents_refusals_carry_their_codes() -> None:
    """The collector and the renderer refuse by code, with the facts the words name."""
    cases = [
        (lambda: BodyCollector.for_encoding("gzip, br", 10), ContentWhy.COMPRESSED_TWICE),
        (lambda: BodyCollector.for_encoding("br", 10), ContentWhy.ENCODING),
        (lambda: BodyCollector.for_encoding("gzip", 10).feed(b"not gzip"), ContentWhy.CORRUPT),
        (lambda: render(b"%PDF", "application/pdf", "https://x.test/"), ContentWhy.NOT_TEXT),
        (lambda: render(b"\x00\x01", "text/plain", "https://x.test/"), ContentWhy.BINARY),
    ]
    for make, why in cases:
        with pytest.raises(ContentRefused) as raised:
            make()
        assert raised.value.refusal.why is why
        assert str(raised.value) == content_words(raised.value.refusal)


def test_an_unresolved_host_is_a_code() -> None:
    """A host that does not resolve fails by code, naming the host and the resolver's words."""
    fetcher = Fetcher(resolver=MapResolver({}), limits=FetchLimits(timeout_seconds=5))
    result = fetcher.fetch("https://nowhere.test/a")
    assert isinstance(result.failed, FetchFailed)
    assert (result.failed.why, result.failed.host) == (FetchWhy.UNRESOLVED, "nowhere.test")
    assert result.text == fetch_failure_words(result.failed)


class _Failing:
    name = "fake"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def search(self, query: str, max_results: int) -> list[SearchHit]:
        raise self.error

    async def asearch(self, query: str, max_results: int) -> list[SearchHit]:
        raise self.error


@pytest.mark.parametrize(
    ("error", "why"),
    [
        (TimeoutError(), SearchWhy.TIMEOUT),
        (ConnectionRefusedError(111, "Connection refused"), SearchWhy.UNREACHABLE),
        (SearchError("the provider's own words"), SearchWhy.SERVICE),
        (ContentRefused(CONTENT), SearchWhy.UNREADABLE),
    ],
)
def test_a_providers_failure_is_a_code(error: BaseException, why: SearchWhy) -> None:
    """What a provider raises becomes a code; a SearchError without one keeps its words."""
    result = Searcher(_Failing(error)).search("otters")
    assert isinstance(result.failed, SearchFailed)
    assert result.failed.why is why
    assert result.text == search_failure_words(result.failed)
    if why is SearchWhy.SERVICE:
        assert result.text.startswith("websearch failed: the provider's own words. ")


def test_a_bad_result_count_quotes_what_was_given() -> None:
    """max_results out of range is refused by code, quoting the value the call gave."""
    result = Searcher(_Failing(TimeoutError())).search("otters", 0)
    assert result.failed == SearchFailed(why=SearchWhy.RESULT_COUNT, given="0")
    assert result.refused
    assert result.text == "max_results must be a whole number from 1 to 20; got 0."
