"""Main-content extraction (`html_to_text(main_content=True)`) and the link styles."""

from __future__ import annotations

import json
import re
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astralvessel.web import html_to_text

PAGES = Path(__file__).parent / "data" / "extract-pages.tar.xz"
_WORD = re.compile(r"\w+")


def _files() -> dict[str, str]:
    with tarfile.open(PAGES, "r:xz") as tar:
        found = {}
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                found[Path(member.name).name] = handle.read().decode("utf-8")
        return found


FILES = _files()
TRUTH = json.loads(FILES["ground-truth.json"])


def shingle_f1(true: str, pred: str) -> float:
    """The article-extraction-benchmark's F1 over 4-word shingles, for one page."""

    def shingles(text: str) -> Counter[tuple[str, ...]]:
        words = _WORD.findall(text)
        return Counter(tuple(words[i : i + 4]) for i in range(max(1, len(words) - 3)))

    truth, guess = shingles(true), shingles(pred)
    hits = sum((truth & guess).values())
    if not hits:
        return 0.0
    precision, recall = hits / sum(guess.values()), hits / sum(truth.values())
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize("key", sorted(TRUTH))
def test_article_pages_come_back_as_their_article(key: str) -> None:
    """On benchmark pages with human-checked article text, the extracted text scores F1 >= 0.9."""
    text = html_to_text(FILES[f"{key}.html"], TRUTH[key]["url"], main_content=True, links="text")
    before = html_to_text(FILES[f"{key}.html"], TRUTH[key]["url"])  # webfetch's text until now
    assert shingle_f1(TRUTH[key]["articleBody"], text) >= 0.9
    assert shingle_f1(TRUTH[key]["articleBody"], before) < 0.8


@pytest.mark.parametrize("name", sorted(name for name in FILES if name.startswith("non-article-")))
def test_pages_that_are_not_articles_keep_their_content(name: str) -> None:
    """A documentation, index or listing page keeps at least 0.97 of the whole page's words."""
    page = FILES[name]
    whole = Counter(_WORD.findall(html_to_text(page, links="text")))
    kept = Counter(_WORD.findall(html_to_text(page, main_content=True, links="text")))
    assert sum((whole & kept).values()) >= 0.97 * sum(whole.values())


def _thread(posts: int) -> str:
    body = "".join(
        f"<div class='post'><div class='who'>user{n}</div><p>Reply {n}: the otters come out at "
        "dusk when the tide turns, more often than at dawn, in my experience.</p></div>"
        for n in range(posts)
    )
    return f"<nav><a href='/'>Home</a></nav><div class='thread'>{body}</div>"


def test_a_forum_thread_keeps_every_post() -> None:
    """Short posts side by side are not one article: every post stays."""
    text = html_to_text(_thread(8), main_content=True)
    assert all(f"Reply {n}:" in text for n in range(8))


def _article(extra: str) -> str:
    body = "".join(
        f"<p>Paragraph {n}: the otters of the estuary come out at dusk, when the tide turns, "
        "and feed along the mud banks until the light is gone.</p>"
        for n in range(12)
    )
    return f"<div class='help'><h2>Keyboard shortcuts</h2><p>Press ? for help</p></div>{extra}" + (
        f"<div class='story'>{body}</div>"
    )


def test_an_extraction_that_saves_little_returns_the_page() -> None:
    """When what the guess leaves out is a small share of the page, the page comes back whole."""
    page = _article("")
    assert html_to_text(page, main_content=True) == html_to_text(page)


def test_an_extraction_that_saves_much_keeps_the_article() -> None:
    """When the guess leaves out a large share (here a menu of links), the article alone comes."""
    menu = (
        "<div>" + "".join(f"<a href='/{n}'>Section number {n}</a> " for n in range(40)) + "</div>"
    )
    text = html_to_text(_article(menu), main_content=True)
    assert "Paragraph 11:" in text
    assert "Section number" not in text
    assert "Keyboard shortcuts" not in text


def test_a_thin_page_is_returned_whole() -> None:
    """When the best guess holds too little text, the whole page comes back."""
    page = "<nav><a href='/a'>Home</a></nav><div><p>One short line of text, only.</p></div>"
    assert html_to_text(page, main_content=True) == html_to_text(page)


def test_references_number_each_target_once() -> None:
    """Links read as [text][N]; a target linked twice keeps one number; the list ends the text."""
    page = "<p><a href='/a'>one</a>, <a href='b'>two</a> and <a href='/a'>one again</a></p>"
    assert html_to_text(page, "https://ex.example/x/", links="references") == (
        "[one][1], [two][2] and [one again][1]\n\n[1]: /a\n[2]: /x/b"
    )


def test_references_to_another_site_stay_whole() -> None:
    """A reference is shortened to its path only on the page's own scheme, host and port."""
    page = (
        "<p><a href='https://other.example/a'>a</a> <a href='http://ex.example/b'>b</a>"
        " <a href='https://ex.example:8443/c'>c</a> <a href='https://ex.example//evil.example/d'>"
        "d</a> <a href='//evil.example/e'>e</a> <a href='/f?g=1#h'>f</a></p>"
    )
    text = html_to_text(page, "https://ex.example/x/", links="references")
    assert text.endswith(
        "[1]: https://other.example/a\n[2]: http://ex.example/b\n[3]: https://ex.example:8443/c\n"
        "[4]: https://ex.example//evil.example/d\n[5]: https://evil.example/e\n[6]: /f?g=1#h"
    )


def test_a_link_that_reads_as_its_target_gets_no_reference() -> None:
    """A link whose text is its URL (its scheme aside) is its text: no [N], no entry."""
    page = (
        "<p>See <a href='https://ex.example/a/'>ex.example/a</a> or"
        " <a href='mailto:otter@ex.example'>otter@ex.example</a> or <a href='/b'>b</a>"
        " or <a href='https://www.ex.example/c'>ex.example/c</a>.</p>"
    )
    assert html_to_text(page, "https://ex.example/", links="references") == (
        "See ex.example/a or otter@ex.example or [b][1] or [ex.example/c][2].\n\n"
        "[1]: /b\n[2]: https://www.ex.example/c"
    )


def test_text_links_keep_only_their_text() -> None:
    """links="text" keeps a link's words and drops its target."""
    assert html_to_text("<p>see <a href='/a'>the map</a></p>", links="text") == "see the map"


def test_page_text_that_looks_like_a_link_marker_stays_text() -> None:
    """A "[" or "](" written in the page is the page's text, never taken for a link of ours."""
    page = "<p>[</p><p>](x)</p><p><a href='/a'>[</a></p>"
    assert html_to_text(page, "https://ex.example/", links="text") == "[\n\n](x)\n\n["


_TAGS = st.sampled_from(
    ["div", "p", "a", "article", "nav", "footer", "table", "td", "tr", "ul", "li", "pre", "h1"]
)
_HTML = st.lists(
    st.one_of(
        st.builds(lambda tag: f"<{tag}>", _TAGS),
        st.builds(lambda tag: f"</{tag}>", _TAGS),
        st.builds(
            lambda tag, cls: f"<{tag} class='{cls}'>",
            _TAGS,
            st.sampled_from(["menu", "content", "share"]),
        ),
        st.just("<a href='/x'>"),
        st.text(max_size=80),
    ),
    max_size=60,
).map("".join)
_BUDGET = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@_BUDGET
@given(page=st.one_of(st.text(), _HTML))
def test_any_input_is_extracted_without_error_and_the_same_each_time(page: str) -> None:
    """Any string, markup or not, gives text without raising, and the same text twice."""
    for links in ("references", "inline", "text"):
        first = html_to_text(page, "https://ex.example/", main_content=True, links=links)
        assert first == html_to_text(page, "https://ex.example/", main_content=True, links=links)
