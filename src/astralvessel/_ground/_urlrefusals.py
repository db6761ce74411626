"""Why webfetch's egress rule refused a URL or an address, and the one wording of each reason.

``web/_egress.py`` decides by code (``UrlRefused``: a ``UrlWhy`` and the facts
it names) and raises ``EgressError`` with these words as its message, which
is public: a host that uses ``Fetcher`` or ``EgressPolicy`` without an
executor reads it. ``results.render_page`` words the model's result from the
same value. Both import this module, in the ground below them, so each
reason has one wording. Pure values, no I/O.
"""

from __future__ import annotations

import attrs

from ..errors import UrlRefused, UrlWhy

__all__ = ["RULE", "UrlRefused", "UrlWhy", "redirected_words", "url_refusal_words"]

#: The sentence every refusal ends with, so the model learns the rule, not only the verdict.
RULE = "webfetch reaches only public addresses on ports 80 and 443"


_WORDS: dict[UrlWhy, str] = {
    UrlWhy.TOO_LONG: "the URL is longer than 8192 characters",
    UrlWhy.URL_CHARS: "the URL contains spaces, control characters or backslashes",
    UrlWhy.UNPARSED: "the URL cannot be parsed ({given})",
    UrlWhy.SCHEME: "the scheme {given!r} is not allowed (use http or https)",
    UrlWhy.NO_SCHEME: "a URL without a scheme is not allowed (use http or https)",
    UrlWhy.USER_INFO: "the URL contains user-info (a name or password before '@')",
    UrlWhy.AFTER_V6: "the URL has text after the IPv6 address",
    UrlWhy.PORT_TEXT: "the port {given!r} is not a number",
    UrlWhy.PORT: "port {port} is not allowed",
    UrlWhy.NO_HOST: "the URL has no host",
    UrlWhy.V6_UNCLOSED: "the IPv6 address in the URL is not closed with ']'",
    UrlWhy.ZONE: "IPv6 zone identifiers ('%') are not allowed",
    UrlWhy.BAD_V6: "{given!r} is not a valid IPv6 address",
    UrlWhy.PERCENT: "the host contains percent-encoding; write it plainly",
    UrlWhy.BAD_NAME: "{given!r} is not a valid host name",
    UrlWhy.ODD_IP: (
        "{given!r} spells an IP address in an unusual form (decimal, octal, hex, short or "
        "with a trailing dot); write IPv4 addresses as four decimal numbers"
    ),
    UrlWhy.LOCAL_NAME: "{given} names this machine (a loopback address)",
    UrlWhy.NOT_AN_ADDRESS: "{host} resolved to {given!r}, which is not an IP address",
    UrlWhy.LITERAL_ADDRESS: "{address} is {kind}",
    UrlWhy.RESOLVED_ADDRESS: "{host} resolves to {address}, which is {kind}",
    UrlWhy.NO_ADDRESSES: "{host} has no addresses",
}


def redirected_words(origin: str, url: str, words: str) -> str:
    """A refusal's ``words`` met on a redirect from ``origin`` to ``url``: saying so."""
    return f"{origin} redirected to {url}, which was {words}"


def url_refusal_words(refused: UrlRefused) -> str:
    """The words of ``refused``: ``EgressError``'s message and the model's result alike."""
    reason = _WORDS[refused.why].format(**attrs.asdict(refused))
    words = f"refused: {reason}; {RULE}."
    if refused.origin:
        return redirected_words(refused.origin, refused.url, words)
    return words
