"""Which part of a page is its main content: a pure choice over the blocks the converter saw.

The converter records one `Block` per structural element as it writes the
page's text (where its text starts and ends in the output, how many characters
it holds and how many of them are link text); `choose` then scores the blocks
the way Readability does (paragraphs give points to their containers, class
names and link density adjust them), keeps the best container with its
related siblings, cuts boilerplate out of them (navigation, share and
"related" boxes, link lists), and answers ``None`` when the guess is thin or
unsure, or saves too little to risk, so that a page that is not an article
(documentation, listings, search results, forum threads, tables) keeps all of
its text.
"""

from __future__ import annotations

import re

__all__ = ["TRACKED", "Block", "choose"]

# Elements that get a Block; other tags' text counts towards the nearest tracked ancestor.
TRACKED = frozenset(
    {
        "html",
        "body",
        "div",
        "section",
        "article",
        "main",
        "header",
        "footer",
        "nav",
        "aside",
        "form",
        "p",
        "pre",
        "td",
        "blockquote",
        "ul",
        "ol",
        "dl",
        "table",
        "figure",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
    }
)
# Elements whose text is a paragraph that gives points to its containers.
_PARAGRAPHS = frozenset({"p", "pre", "td", "blockquote"})
# Readability's starting score of a container, by tag.
_TAG_SCORE = {
    "div": 5.0,
    "article": 5.0,
    "main": 5.0,
    "section": 3.0,
    "pre": 3.0,
    "td": 3.0,
    "blockquote": 3.0,
    "ol": -3.0,
    "ul": -3.0,
    "dl": -3.0,
    "form": -3.0,
}
# Elements that are page furniture wherever they stand.
_FURNITURE = frozenset({"nav", "aside", "footer"})
# Class names of page furniture: Readability's "unlikely candidates" and a few more.
_UNLIKELY = re.compile(
    r"-ad-|ad-break|agegate|banner|breadcrumb|combx|comment|community|cover-wrap|disqus|extra"
    r"|footer|gdpr|header|legends|menu|related|remark|replies|rss|shoutbox|sidebar|skyscraper"
    r"|social|sponsor|supplemental|pagination|pager|popup|yom-remote|newsletter|outbrain"
    r"|taboola|share|sharing|recommend|rail\b|rail-|-rail|trending|most-?popular|more-?stories",
    re.IGNORECASE,
)
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# Elements that class names never make furniture ("section-header" on an <h2>).
_NEVER_FURNITURE = frozenset({"html", "body", "main", "article"}) | _HEADINGS
# Comment sections stay furniture even where they outweigh the article.
_COMMENTS = re.compile(r"comment|disqus|replies|respond", re.IGNORECASE)
# Inside the main content: pictures and their captions, credits and galleries.
_MEDIA = re.compile(r"caption|credit|gallery|slideshow|carousel|lightbox", re.IGNORECASE)
# Siblings of the main content that carry content other than paragraphs: kept beside it
# when mostly not links (a documentation page's lists of items, a table of figures).
_LISTINGS = frozenset({"ul", "ol", "dl", "table", "pre", "blockquote"})
# Class names that say "part of the article" or "a wrapper of the whole page", which an
# unlikely name beside them ("wrapper-boxed header-style-2", "Page-ad-margins") does not undo.
_LIKELY = re.compile(
    r"article|body|column|content|main|shadow|story|entry|post|text|prose"
    r"|wrap|container|layout|boxed|margins|site|page",
    re.IGNORECASE,
)
# Readability's class-name weights: +25 for a positive name, -25 for a negative one.
_POSITIVE = re.compile(
    r"article|body|content|entry|hentry|h-entry|main|page|pagination|post|text|blog|story|prose",
    re.IGNORECASE,
)
_NEGATIVE = re.compile(
    r"-ad-|hidden|\bhid\b|banner|combx|comment|com-|contact|foot|footer|footnote|gdpr|masthead"
    r"|media|meta|outbrain|promo|related|scroll|share|shoutbox|sidebar|skyscraper|sponsor"
    r"|shopping|tags|tool|widget|byline|newsletter|subscribe|social",
    re.IGNORECASE,
)
# Below this many characters of kept text the guess is too thin to trust.
_MIN_KEPT_CHARS = 250
# The kept text must hold this share of the page's paragraph points, or the page has
# content the guess did not find (a forum thread, a listing): keep the page.
_MIN_PARAGRAPH_SHARE = 0.2
# An extraction that leaves out less than this share of the page's text, or fewer than
# this many characters (about 50 words), saves the reader little and may drop content (a
# documentation page's heading, a box of help): keep the page.
_MAX_KEPT_SHARE = 0.9
_MIN_SAVED_CHARS = 300
# An ancestor with this many times the paragraph points of the best block is the article.
_CLIMB = 1.6


class Block:
    """One tracked element: its span in the converter's output and what its text is made of."""

    __slots__ = (
        "commas",
        "end",
        "hint",
        "link",
        "mass",
        "own",
        "parent",
        "score",
        "start",
        "tag",
        "text",
    )

    def __init__(self, tag: str, hint: str, start: int, parent: int) -> None:
        self.tag = tag
        self.hint = hint  # class and id, for the class-name weights
        self.start = start  # index in the output where the element's text begins
        self.end = -1  # index in the output where it ends; -1 while open
        self.parent = parent  # index of the enclosing Block; -1 at the top
        self.text = 0  # characters of text, descendants included
        self.link = 0  # of which inside links
        self.own = 0  # characters of non-link text directly inside, not in a tracked child
        self.commas = 0
        self.score = 0.0  # points from paragraphs
        self.mass = 0.0  # paragraph points of every paragraph inside

    def paragraph_points(self) -> float:
        """What this block gives its containers as a paragraph (0 when it is not one)."""
        if self.tag in _PARAGRAPHS:
            length = self.text - self.link
        elif self.tag == "div":
            length = self.own
        else:
            return 0.0
        if length < 25:
            return 0.0
        return 1.0 + self.commas + min(length // 100, 3)


def _unlikely(hint: str) -> bool:
    return bool(hint) and bool(_UNLIKELY.search(hint)) and not _LIKELY.search(hint)


def close_block(blocks: list[Block], index: int, end: int) -> None:
    """Finish a block as its element closes: its span, its counts up the tree, its points."""
    block = blocks[index]
    block.end = end
    points = block.paragraph_points()
    block.mass += points
    parent_index = block.parent
    if parent_index < 0:
        return
    parent = blocks[parent_index]
    parent.text += block.text
    parent.link += block.link
    parent.mass += block.mass
    level = 0
    while points and parent_index >= 0 and level < 5:
        divider = 1.0 if level == 0 else 2.0 if level == 1 else level * 3.0
        blocks[parent_index].score += points / divider
        parent_index = blocks[parent_index].parent
        level += 1


def _weight(hint: str) -> float:
    if not hint:
        return 0.0
    return (25.0 if _POSITIVE.search(hint) else 0.0) - (25.0 if _NEGATIVE.search(hint) else 0.0)


def _density(block: Block) -> float:
    return block.link / block.text if block.text else 0.0


def _cut(block: Block, furniture: bool) -> bool:
    """Whether a block inside the main content is boilerplate to leave out."""
    if furniture or block.tag == "figure" or _MEDIA.search(block.hint):
        return True
    if block.tag in ("ul", "ol", "div", "section", "table", "dl", "header"):
        density = _density(block)
        weight = _weight(block.hint)
        if weight < 0 and block.score < 10:
            return True
        if density > 0.5 or (density > 0.25 and weight < 25 and block.text < 200):
            return block.tag != "table" or density > 0.6
    return False


def _furnish(blocks: list[Block]) -> list[bool]:
    """Which blocks are inside furniture; a block that holds most of the page's text is not
    furniture whatever its class names say (a "sticky sidebar" plugin wrapping the article)."""
    page_text = max((block.text for block in blocks), default=0)
    inside = [False] * len(blocks)
    for index, block in enumerate(blocks):
        parent = block.parent
        if parent >= 0 and inside[parent]:
            inside[index] = True
        elif block.text:  # an empty block's class is moot
            tag = block.tag
            if tag in _NEVER_FURNITURE:
                continue
            if block.text * 2 < page_text:
                inside[index] = tag in _FURNITURE or _unlikely(block.hint)
            else:  # only comments outweigh the article and stay furniture
                inside[index] = bool(_COMMENTS.search(block.hint)) and _unlikely(block.hint)
    return inside


def _top(blocks: list[Block], furniture: list[bool]) -> int:
    best, best_score = -1, 0.0
    for index, block in enumerate(blocks):
        if block.score <= 0 or furniture[index]:
            continue
        score = (block.score + _TAG_SCORE.get(block.tag, 0.0) + _weight(block.hint)) * (
            1.0 - _density(block)
        )
        if score > best_score:
            best, best_score = index, score
    return best


def _roots(blocks: list[Block], top: int, furniture: list[bool]) -> list[int]:
    """The top candidate and its siblings that look like part of the same content."""
    parent = blocks[top].parent
    if parent < 0:
        return [top]
    top_block = blocks[top]
    threshold = max(10.0, top_block.score * 0.2)
    roots = []
    for index in range(parent + 1, len(blocks)):
        block = blocks[index]
        if block.parent != parent:
            continue
        if index == top:
            roots.append(index)
            continue
        if furniture[index]:
            continue
        bonus = top_block.score * 0.2 if block.hint and block.hint == top_block.hint else 0.0
        prose = block.tag == "p" and block.text > 80 and _density(block) < 0.25
        listing = block.tag in _LISTINGS and block.text - block.link >= 80
        listing = listing and _density(block) < 0.33
        if block.score + bonus >= threshold or prose or listing or block.tag in _HEADINGS:
            roots.append(index)
    return roots


def _climb(blocks: list[Block], top: int, furniture: list[bool]) -> int:
    """An ancestor of ``top`` that holds clearly more of the page's paragraphs (an article
    split into several boxes, each too small to win alone), reached through wrappers that
    add none; ``top`` itself when there is none."""
    node = top
    while True:
        parent = blocks[node].parent
        if parent < 0 or furniture[parent] or _density(blocks[parent]) > 0.5:
            return top
        mass = blocks[parent].mass
        if mass >= _CLIMB * blocks[top].mass:
            top = parent
        elif mass > blocks[top].mass:
            return top
        node = parent


def choose(blocks: list[Block]) -> list[tuple[int, int]] | None:
    """The output spans that hold the main content, in order, or None to keep the whole page."""
    furniture = _furnish(blocks)
    top = _top(blocks, furniture)
    if top < 0:
        return None
    roots = set(_roots(blocks, _climb(blocks, top, furniture), furniture))
    # 1 kept, 0 not reached, -1 cut; parents come before their children in ``blocks``.
    state = [0] * len(blocks)
    spans: list[tuple[int, int]] = []
    cuts: list[tuple[int, int]] = []
    kept_points = page_points = 0.0
    kept_text = page_text = 0
    for index, block in enumerate(blocks):
        parent = block.parent
        if parent < 0:
            page_text += block.text
        if index in roots:
            state[index] = 1
            spans.append((block.start, block.end))
            kept_text += block.text
        elif parent >= 0 and state[parent] == 1:
            if _cut(block, furniture[index]):
                state[index] = -1
                cuts.append((block.start, block.end))
                kept_text -= block.text
            else:
                state[index] = 1
        if not furniture[index]:
            points = block.paragraph_points()
            page_points += points
            kept_points += points if state[index] == 1 else 0.0
    kept = _subtract(spans, cuts)
    kept_chars = sum(blocks[index].text - blocks[index].link for index in roots)
    if kept_chars < _MIN_KEPT_CHARS or kept_points < _MIN_PARAGRAPH_SHARE * page_points:
        return None
    if kept_text > _MAX_KEPT_SHARE * page_text or page_text - kept_text < _MIN_SAVED_CHARS:
        return None
    return kept


def _subtract(spans: list[tuple[int, int]], cuts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` with every ``cuts`` range taken out; both are sorted by start."""
    kept: list[tuple[int, int]] = []
    cuts = sorted(cuts)
    position = 0
    for start, end in spans:
        cursor = start
        while position < len(cuts) and cuts[position][0] < end:
            cut_start, cut_end = cuts[position]
            if cut_start > cursor:
                kept.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
            position += 1
        if cursor < end:
            kept.append((cursor, end))
    return kept
