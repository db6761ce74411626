"""HTML to readable text for a model: headings, paragraphs, lists, links, tables and code.

One pass of a small regular-expression tokenizer (tags, comments, raw-text
elements such as ``<script>``, entities), keeping a small stack of open
elements so hidden subtrees (``hidden``, ``aria-hidden``, ``display:none``,
scripts, styles, templates) can be dropped whole, and so the usual unclosed
``<p>``/``<li>``/``<td>`` close the way browsers close them. The tokenizer
is several times faster than the standard library's `html.parser`, and any
tokenizing mistake can only change which text shows: the fence is applied to
the finished text, never to the markup.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import unescape

from ._links import LINK_OPEN, LinkEnd, LinkStyle, assemble
from ._readable import TRACKED, Block, choose, close_block

__all__ = ["html_to_text"]

# Elements whose contents never reach the reader.
_DROPPED = frozenset(
    {
        "script",
        "style",
        "template",
        "noscript",
        "head",
        "svg",
        "math",
        "iframe",
        "object",
        "canvas",
        "select",
        "button",
        "datalist",
        "dialog",
        "map",
        "audio",
        "video",
    }
)
_VOID = frozenset(
    {
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "param",
        "source",
        "track",
        "wbr",
        "keygen",
    }
)
_BLOCK = frozenset(
    {
        "address",
        "article",
        "aside",
        "blockquote",
        "center",
        "dd",
        "details",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "header",
        "hgroup",
        "main",
        "nav",
        "section",
        "summary",
        "caption",
        "legend",
        "body",
        "html",
    }
)
# Starting one of these closes an open <p>, as in the HTML parsing algorithm.
_CLOSES_P = _BLOCK | {"p", "ul", "ol", "pre", "table", "h1", "h2", "h3", "h4", "h5", "h6", "hr"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_MAX_DEPTH = 512
# Deeper lists are shown at this depth, so hostile nesting cannot multiply the output.
_MAX_INDENT = 8


# One token: a comment, a declaration or processing instruction, an end tag, a start tag
# (quoted attribute values may hold ">"), or a run of text; a "<" that starts none is text.
# No branch but the comment's scans past the next "<", so tokenizing stays linear however
# hostile the page: a quoted value containing "<" makes its tag read as text instead.
_TOKEN = re.compile(
    r"""<!--.*?(?:--!?>|\Z)"""
    r"""|<![^<>]*>?|<\?[^<>]*>?"""
    r"""|</([a-zA-Z][^\s/<>]*)[^<>]*>?"""
    r"""|<([a-zA-Z][^\s/<>]*)((?:[^<>"']|"[^"<]*"|'[^'<]*')*)>"""
    r"""|<?[^<]+|<""",
    re.DOTALL,
)
_ATTRIBUTE = re.compile(r"""([^\s=/>"']+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+)))?""")
# Elements whose content is raw text up to their own end tag, whatever it looks like.
_RAW_TEXT = frozenset(
    {"script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "noscript"}
)
# What a link's text may leave out of its target and still be the target: its scheme.
_BARE = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)?(?://)?")
_RAW_END: dict[str, re.Pattern[str]] = {
    name: re.compile(rf"</{name}[\s/>]", re.IGNORECASE) for name in _RAW_TEXT
}


class _Converter:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.out: list[str] = []
        self.stack: list[str] = []  # open element names
        self.skip_at: int | None = None  # stack depth at which a dropped subtree started
        self.pending_breaks = 0  # newlines owed before the next text
        self.at_line_start = True
        self.space_owed = False
        self.pre_depth = 0
        self.lists: list[list[int]] = []  # per open list: [is_ordered, next number]
        self.links: list[tuple[int, str]] = []  # (index in out where "[" went, href)
        self.cell_depth = 0
        self.row_cells = 0
        self.row_has_header = False
        self.header_rule_done: list[bool] = []
        self.title: list[str] = []
        self.in_title = False
        self.blocks: list[Block] = []  # tracked elements, for the main-content choice
        self.open_blocks: list[int] = []

    # -- output helpers ---------------------------------------------------------------------

    def block(self, breaks: int) -> None:
        if self.cell_depth:
            self.space_owed = True
            return
        if self.out:
            self.pending_breaks = max(self.pending_breaks, breaks)
        self.space_owed = False

    def emit(self, text: str) -> None:
        """Write text that is already formatted (markers, fences), flushing owed breaks."""
        if self.pending_breaks:
            self.out.append("\n" * self.pending_breaks)
            self.pending_breaks = 0
            self.at_line_start = True
            self.space_owed = False
            if self.lists and not self.pre_depth:
                self.out.append("  " * min(len(self.lists), _MAX_INDENT))
        elif self.space_owed and not self.at_line_start:
            self.out.append(" ")
        self.space_owed = False
        self.out.append(text)
        self.at_line_start = text.endswith("\n")

    # -- parser callbacks -------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            # The title lives in <head>, which is otherwise dropped; keep the first one only.
            self.in_title = not self.title
            return
        if self.skip_at is not None:
            if tag not in _VOID and len(self.stack) < _MAX_DEPTH:
                self.stack.append(tag)
            return
        hidden, href = _hidden_and_href(tag, attrs)
        if tag in _CLOSES_P and "p" in self.stack[-8:]:
            self._close("p")
        implied = _IMPLIED_END.get(tag)
        if implied is not None:
            self._close_within(*implied)
        if tag in _VOID:
            if not hidden:
                self._void(tag)
            return
        if len(self.stack) < _MAX_DEPTH:
            self.stack.append(tag)
        else:
            return
        if hidden:
            self.skip_at = len(self.stack)
            return
        if tag in TRACKED:
            self._track(tag, attrs)
        opener = _OPENERS.get(tag)
        if opener is not None:
            opener(self, tag, href)

    def _track(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        hint = " ".join(value for name, value in attrs if value and name in ("class", "id"))
        parent = self.open_blocks[-1] if self.open_blocks else -1
        self.open_blocks.append(len(self.blocks))
        self.blocks.append(Block(tag, hint, len(self.out), parent))

    def _count(self, text: str) -> None:
        """Count text towards the innermost tracked element, for the main-content choice."""
        if not self.open_blocks:
            return
        block = self.blocks[self.open_blocks[-1]]
        length = len(text)
        block.text += length
        if self.links:
            block.link += length
        else:
            block.own += length
            block.commas += text.count(",")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
            return
        if tag in ("p", "br") and self.skip_at is None and tag not in self.stack[-8:]:
            self.block(2 if tag == "p" else 1)
            if tag == "br":
                self.emit("\n")
            return
        self._close(tag)

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
            return
        if self.skip_at is not None:
            return
        if self.pre_depth:
            self.emit(data)
            self._count(data)
            return
        if not data.strip():
            if data:
                self.space_owed = True
            return
        if data[0].isspace():
            self.space_owed = True
        text = _SPACES.sub(" ", data.strip())
        self.emit(text)
        self._count(text)
        if data[-1].isspace():
            self.space_owed = True

    # -- structure --------------------------------------------------------------------------

    def _close_within(self, wanted: tuple[str, ...], scope: tuple[str, ...]) -> None:
        for index in range(len(self.stack) - 1, max(-1, len(self.stack) - 64), -1):
            name = self.stack[index]
            if name in scope:
                return
            if name in wanted:
                self._close(name)
                return

    def _close(self, tag: str) -> None:
        stack = self.stack
        for index in range(len(stack) - 1, max(-1, len(stack) - 64), -1):
            if stack[index] == tag:
                while len(stack) > index:
                    name = stack.pop()
                    if self.skip_at is not None:
                        if len(stack) < self.skip_at:
                            self.skip_at = None
                        continue
                    self._end(name)
                return

    def _void(self, tag: str) -> None:
        if tag == "br":
            if self.cell_depth:
                self.space_owed = True
            else:
                self.emit("\n")
        elif tag == "hr":
            self.block(2)
            self.emit("---")
            self.block(2)

    def _emit_marker(self, marker: str) -> None:
        if self.pending_breaks:
            self.out.append("\n" * self.pending_breaks)
            self.pending_breaks = 0
        self.out.append("  " * min(len(self.lists) - 1, _MAX_INDENT) + marker)
        self.at_line_start = False
        self.space_owed = False

    # -- one opener and one closer per element, chosen by the tables below the class ---------

    def _open_block(self, tag: str, href: str | None) -> None:
        self.block(1)

    def _open_paragraph(self, tag: str, href: str | None) -> None:
        self.block(2)

    def _open_heading(self, tag: str, href: str | None) -> None:
        self.block(2)
        self.emit("#" * _HEADINGS[tag] + " ")

    def _open_list(self, tag: str, href: str | None) -> None:
        self.block(1 if self.lists else 2)
        self.lists.append([tag == "ol", 1])

    def _open_item(self, tag: str, href: str | None) -> None:
        self.block(1)
        if not self.lists:
            self.emit("- ")
            return
        kind = self.lists[-1]
        if kind[0]:
            marker = f"{kind[1]}. "
            kind[1] += 1
        else:
            marker = "- "
        self._emit_marker(marker)

    def _open_pre(self, tag: str, href: str | None) -> None:
        self.block(2)
        self.emit("```\n")
        self.pre_depth += 1

    def _open_code(self, tag: str, href: str | None) -> None:
        if not self.pre_depth:
            self.emit("`")

    def _open_link(self, tag: str, href: str | None) -> None:
        if href and not href.lower().lstrip().startswith(("javascript:", "data:", "#")):
            self.emit(LINK_OPEN)
            self.links.append((len(self.out) - 1, href.strip()))
        else:
            self.links.append((-1, ""))

    def _open_strong(self, tag: str, href: str | None) -> None:
        self.emit("**")

    def _open_emphasis(self, tag: str, href: str | None) -> None:
        self.emit("*")

    def _open_table(self, tag: str, href: str | None) -> None:
        self.block(2)
        self.header_rule_done.append(False)

    def _open_row(self, tag: str, href: str | None) -> None:
        self.block(1)
        self.row_cells = 0
        self.row_has_header = False
        self.emit("|")

    def _open_cell(self, tag: str, href: str | None) -> None:
        self.cell_depth += 1
        self.row_cells += 1
        self.row_has_header |= tag == "th"
        self.space_owed = True

    def _open_quote(self, tag: str, href: str | None) -> None:
        self.block(2)
        self.emit("> ")

    def _end_block(self) -> None:
        self.block(1)

    def _end_paragraph(self) -> None:
        self.block(2)

    def _end_list(self) -> None:
        if self.lists:
            self.lists.pop()
        self.block(1 if self.lists else 2)

    def _end_pre(self) -> None:
        self.pre_depth = max(0, self.pre_depth - 1)
        if not self.at_line_start:
            self.emit("\n")
        self.emit("```")
        self.block(2)

    def _end_code(self) -> None:
        if not self.pre_depth:
            self.space_owed = False
            self.out.append("`")

    def _end_link(self) -> None:
        if not self.links:
            return
        start, url = self.links.pop()
        if start < 0:
            return
        text = "".join(self.out[start + 1 :]).strip()
        if text and not _names_itself(text, url):
            self.out.append(LinkEnd(url))
            self.at_line_start = False
        else:
            # Blanked, not deleted, so the spans of tracked elements keep their places.
            self.out[start] = ""

    def _end_strong(self) -> None:
        self.out.append("**")

    def _end_emphasis(self) -> None:
        self.out.append("*")

    def _end_cell(self) -> None:
        self.cell_depth = max(0, self.cell_depth - 1)
        self.space_owed = False
        self.out.append(" |")

    def _end_row(self) -> None:
        if self.row_has_header and self.header_rule_done and not self.header_rule_done[-1]:
            self.header_rule_done[-1] = True
            self.block(1)
            self.emit("|" + " --- |" * max(1, self.row_cells))
        self.block(1)

    def _end_table(self) -> None:
        if self.header_rule_done:
            self.header_rule_done.pop()
        self.block(2)

    def _end(self, tag: str) -> None:
        closer = _CLOSERS.get(tag)
        if closer is not None:
            closer(self)
        if tag in TRACKED and self.open_blocks and self.blocks[self.open_blocks[-1]].tag == tag:
            close_block(self.blocks, self.open_blocks.pop(), len(self.out))

    def result(self, main_content: bool, links: LinkStyle) -> str:
        while self.open_blocks:
            close_block(self.blocks, self.open_blocks.pop(), len(self.out))
        spans = choose(self.blocks) if main_content else None
        if spans is None:
            spans = [(0, len(self.out))]
        else:
            # The article's own heading is in its text; the <title> repeats it with the site's name.
            self.title = []
        body, references = assemble(self.out, spans, links, self.base_url)
        body = body.strip("\n")
        # Trailing spaces carry no meaning for a reader; three or more newlines collapse to two.
        body = re.sub(r"[ \t]+\n", "\n", body)
        body = re.sub(r"\n{3,}", "\n\n", body)
        if references:
            body += "\n\n" + "\n".join(f"[{number}]: {url}" for number, url in references)
        title = _SPACES.sub(" ", "".join(self.title)).strip()
        if title:
            return f"# {title}\n\n{body}" if body else f"# {title}"
        return body

    def feed(self, html: str) -> None:
        """Tokenize the whole document and drive the handlers."""
        position = 0
        length = len(html)
        token = _TOKEN
        while position < length:
            match = token.match(html, position)
            if match is None:  # pragma: no cover - the pattern matches any character
                break
            position = match.end()
            end_name, start_name = match.group(1), match.group(2)
            if start_name is not None:
                tag = start_name.lower()
                raw_attributes = match.group(3)
                # Inside a dropped subtree only the names count (to find its end).
                keep = self.skip_at is None and raw_attributes.strip()
                attributes = _attributes(raw_attributes) if keep else []
                self.handle_starttag(tag, attributes)
                if tag in _RAW_TEXT:
                    closing = _RAW_END[tag].search(html, position)
                    stop = closing.start() if closing else length
                    raw = html[position:stop]
                    if tag in ("title", "textarea"):
                        self.handle_data(unescape(raw) if "&" in raw else raw)
                    position = stop
            elif end_name is not None:
                self.handle_endtag(end_name.lower())
            else:
                text = match.group(0)
                if not text.startswith(("<!", "<?")):
                    self.handle_data(unescape(text) if "&" in text else text)
            # Comments, declarations and processing instructions carry no text.


def _names_itself(text: str, href: str) -> bool:
    """Whether a link's text is its target written out (``<a href=URL>URL</a>``): the
    reader has the target already, so a reference would only repeat it."""
    if "." not in text or len(text) > len(href) + 1:  # most link texts: cheap to rule out
        return False
    return _BARE.sub("", text).rstrip("/") == _BARE.sub("", href).rstrip("/")


def _hidden_and_href(tag: str, attrs: list[tuple[str, str | None]]) -> tuple[bool, str | None]:
    """Whether an element is hidden from a reader (so dropped whole), and its link target."""
    hidden = tag in _DROPPED
    href = None
    for name, value in attrs:
        if (
            name == "hidden"
            or (name == "aria-hidden" and value == "true")
            or (name == "style" and value and _HIDDEN_STYLE.search(value))
            or (name == "type" and tag == "input" and value == "hidden")
        ):
            hidden = True
        elif name == "href":
            href = value
    return hidden, href


# Starting one of these ends the named open elements, searching up to (not past) the scope.
_IMPLIED_END: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "li": (("li",), ("ul", "ol")),
    "td": (("td", "th"), ("tr", "table")),
    "th": (("td", "th"), ("tr", "table")),
    "tr": (("tr",), ("table",)),
    "dt": (("dt", "dd"), ("dl",)),
    "dd": (("dt", "dd"), ("dl",)),
}

# What each element writes when it opens and when it closes; a tag not listed writes nothing.
_OPENERS: dict[str, Callable[[_Converter, str, str | None], None]] = {
    **dict.fromkeys(_BLOCK | {"dt", "dd"}, _Converter._open_block),
    **dict.fromkeys(_HEADINGS, _Converter._open_heading),
    "p": _Converter._open_paragraph,
    "ul": _Converter._open_list,
    "ol": _Converter._open_list,
    "li": _Converter._open_item,
    "pre": _Converter._open_pre,
    "code": _Converter._open_code,
    "a": _Converter._open_link,
    "b": _Converter._open_strong,
    "strong": _Converter._open_strong,
    "i": _Converter._open_emphasis,
    "em": _Converter._open_emphasis,
    "table": _Converter._open_table,
    "tr": _Converter._open_row,
    "td": _Converter._open_cell,
    "th": _Converter._open_cell,
    "blockquote": _Converter._open_quote,
}
_CLOSERS: dict[str, Callable[[_Converter], None]] = {
    **dict.fromkeys(_BLOCK | {"dt", "dd", "li"}, _Converter._end_block),
    **dict.fromkeys(_HEADINGS, _Converter._end_paragraph),
    "p": _Converter._end_paragraph,
    "blockquote": _Converter._end_paragraph,
    "ul": _Converter._end_list,
    "ol": _Converter._end_list,
    "pre": _Converter._end_pre,
    "code": _Converter._end_code,
    "a": _Converter._end_link,
    "b": _Converter._end_strong,
    "strong": _Converter._end_strong,
    "i": _Converter._end_emphasis,
    "em": _Converter._end_emphasis,
    "td": _Converter._end_cell,
    "th": _Converter._end_cell,
    "tr": _Converter._end_row,
    "table": _Converter._end_table,
}


def _attributes(text: str) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for match in _ATTRIBUTE.finditer(text):
        name, double, single, bare = match.groups()
        value = double if double is not None else single if single is not None else bare
        if value is not None and "&" in value:
            value = unescape(value)
        found.append((name.lower(), value))
    return found


def html_to_text(
    html: str, base_url: str = "", *, main_content: bool = False, links: LinkStyle = "inline"
) -> str:
    """Reduce an HTML document to readable text, with links made absolute against ``base_url``.

    With ``main_content``, keep only the page's main content (its article) when it has
    one it can be sure of, and the whole page otherwise. ``links`` writes each link
    as Markdown with its target (``"inline"``), as ``[text][N]`` with the numbered
    targets listed at the end (``"references"``), or as its text alone (``"text"``).
    """
    converter = _Converter(base_url)
    converter.feed(html)
    if converter.stack:
        # Close whatever the page left open, so a <pre> fence or a link still ends.
        converter._close(converter.stack[0])
    return converter.result(main_content, links)
