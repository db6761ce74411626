"""Why the egress proxy refused a connection, its words, and a call's record of them.

The proxy decides by reason code (``Refused``: the code and the facts it
names); ``refusal_words`` is the one wording of each code, which the proxy's
own reply to the sandboxed client quotes (the body curl prints) and
``results.refusal_notes`` quotes after the call's output. It lives here, in the
ground below both wings, because both need the same words: ``web/`` for the
reply, which the model reads too, and ``results.py`` for the notes.

The turn drains the record after each call. However many connections a call
has refused, the record holds at most ``DESTINATIONS`` destinations, each
with its first reason (every fact cut to ``REASON_CHARS``) and a count, and
one count for the rest: a flood of refusals costs the host a fixed amount of
memory, whatever its length. Pure values, no I/O.
"""

from __future__ import annotations

import enum

import attrs

__all__ = [
    "DESTINATIONS",
    "REASON_CHARS",
    "RULE",
    "Refusals",
    "Refused",
    "RefusedDestination",
    "Why",
    "cut_reason",
    "record",
    "refusal_words",
]

#: The distinct destinations one call's record names; the rest are only counted.
DESTINATIONS = 10
#: A reason's characters kept (the proxy's own reasons are shorter; a list of names may not be).
REASON_CHARS = 300
#: What every refusal of a name or an address ends with, so the call learns the rule.
RULE = "the sandbox reaches only the hosts on this turn's network allow-list, by name"


class Why(enum.Enum):
    """Why the proxy refused a connection: one code per rule it applies."""

    # The request head.
    HEAD_TOO_LONG = "head_too_long"
    HEAD_UNENDED = "head_unended"
    HEAD_TIMEOUT = "head_timeout"
    REQUEST_LINE = "request_line"
    TARGET_CHARS = "target_chars"
    TOO_MANY_FIELDS = "too_many_fields"
    FIELD_LINE = "field_line"
    FIELD_CONTROLS = "field_controls"
    # Where the request goes.
    USER_INFO = "user_info"
    NO_PORT = "no_port"
    BAD_PORT = "bad_port"
    NOT_A_NAME = "not_a_name"
    IP_ADDRESS = "ip_address"
    SPELLS_IP = "spells_ip"
    NOT_LISTED = "not_listed"
    CONNECT_PORT_80 = "connect_port_80"
    HTTPS_UNTUNNELLED = "https_untunnelled"
    NOT_PROXY_FORM = "not_proxy_form"
    # The request body.
    FRAMED_TWICE = "framed_twice"
    TRANSFER_CODING = "transfer_coding"
    BAD_LENGTH = "bad_length"
    CHUNK_LINE = "chunk_line"
    CHUNK_LINE_LONG = "chunk_line_long"
    CHUNK_END = "chunk_end"
    TRAILER_FIELDS = "trailer_fields"
    # A tunnel's first bytes.
    NO_TLS = "no_tls"
    # The name's addresses and the origin.
    NO_RESOLVE = "no_resolve"
    NOT_AN_ADDRESS = "not_an_address"
    ADDRESS_REFUSED = "address_refused"
    NO_ADDRESSES = "no_addresses"
    CANNOT_CONNECT = "cannot_connect"
    # The turn's budget.
    CONCURRENT = "concurrent"
    CONNECTIONS = "connections"
    TOTAL_BYTES = "total_bytes"


@attrs.frozen(kw_only=True)
class Refused:
    """One refusal's reason: its code and the facts its words name."""

    why: Why
    #: The host name the words name (as the request gave it, when it is not a name).
    host: str = ""
    port: int = 0
    #: What the request or the system gave that the words quote: a port, a name, an answer,
    #: an error.
    given: str = ""
    #: The address a name resolved to, and what kind of address it is.
    address: str = ""
    kind: str = ""
    #: The bound met: a count, bytes, or seconds.
    limit: float = 0
    #: The turn's allow-list, as the words show it (the first 20 patterns).
    listed: str = ""


_WORDS: dict[Why, str] = {
    Why.HEAD_TOO_LONG: "the request head is longer than {limit} bytes",
    Why.HEAD_UNENDED: "the request head does not end with a blank line (CRLF CRLF)",
    Why.HEAD_TIMEOUT: "the request head did not arrive within {limit:g} s",
    Why.REQUEST_LINE: "the request line is not 'METHOD TARGET HTTP/1.1'",
    Why.TARGET_CHARS: "the request target holds spaces, controls or non-ASCII bytes",
    Why.TOO_MANY_FIELDS: "the request has more than {limit} header fields",
    Why.FIELD_LINE: "a header line is not 'Name: value'",
    Why.FIELD_CONTROLS: "a header value holds control characters",
    Why.USER_INFO: "user-info (a name or password before '@') is refused",
    Why.NO_PORT: "CONNECT {given!r} names no port; write host:port",
    Why.BAD_PORT: "the port {given!r} is not a number from 1 to 65535",
    Why.NOT_A_NAME: "{given!r} is not a host name",
    Why.IP_ADDRESS: "{host} is an IP address; " + RULE,
    Why.SPELLS_IP: "{host} spells an IP address; " + RULE,
    Why.NOT_LISTED: "{host}:{port} is not on this turn's network allow-list ({listed}); " + RULE,
    Why.CONNECT_PORT_80: (
        "CONNECT to port 80 is refused: send plain http as an absolute "
        "http://{host}/ URL (HTTP_PROXY does so), whose Host the proxy sets"
    ),
    Why.HTTPS_UNTUNNELLED: "send https through a CONNECT tunnel (HTTPS_PROXY does so)",
    Why.NOT_PROXY_FORM: "this is a proxy: send an absolute http:// URL, or CONNECT host:port",
    Why.FRAMED_TWICE: "the request frames its body twice (Content-Length and more)",
    Why.TRANSFER_CODING: "the only transfer coding the proxy passes on is 'chunked'",
    Why.BAD_LENGTH: "the Content-Length is not a number",
    Why.CHUNK_LINE: "a chunk of the request body is not framed as 'SIZE CRLF' (hex)",
    Why.CHUNK_LINE_LONG: "a chunk's size line is too long",
    Why.CHUNK_END: "a chunk of the request body does not end with CRLF",
    Why.TRAILER_FIELDS: "the request body's trailer has more than {limit} fields",
    Why.NO_TLS: (
        "the tunnel to {host}:{port} carried no TLS; a tunnel carries only TLS, and plain "
        "http goes as an absolute http:// URL, whose Host the proxy sets"
    ),
    Why.NO_RESOLVE: "{host} does not resolve ({given})",
    Why.NOT_AN_ADDRESS: "{host} resolved to {given!r}, not an address",
    Why.ADDRESS_REFUSED: "{host} resolves to {address}, which is {kind}",
    Why.NO_ADDRESSES: "{host} has no addresses",
    Why.CANNOT_CONNECT: "cannot connect to {host}:{port} ({given})",
    Why.CONCURRENT: "the turn already has {limit} connections open",
    Why.CONNECTIONS: "the turn has used all its {limit} connections",
    Why.TOTAL_BYTES: "the turn has moved all its {limit} bytes",
}


def refusal_words(refused: Refused) -> str:
    """The reason ``refused`` gives, in the words the call reads (the reply and the note)."""
    return _WORDS[refused.why].format(**attrs.asdict(refused))


def cut_reason(words: str) -> str:
    """``words`` within ``REASON_CHARS`` (a list of names may be long)."""
    return words if len(words) <= REASON_CHARS else words[: REASON_CHARS - 3] + "..."


@attrs.frozen
class RefusedDestination:
    """One destination the proxy refused: where the call asked to go, why, and how often."""

    #: The host name as the request gave it; "" when the request named none the proxy could read.
    host: str
    #: The port it asked for; 0 when the request named none.
    port: int
    #: Why the proxy refused its first connection.
    refused: Refused
    count: int = 1

    @property
    def reason(self) -> str:
        """The first refusal's words, cut to ``REASON_CHARS``."""
        return cut_reason(refusal_words(self.refused))


@attrs.frozen
class Refusals:
    """A call's refused connections: at most DESTINATIONS named, and a count of the others."""

    destinations: tuple[RefusedDestination, ...] = ()
    #: Refused connections to destinations past the first DESTINATIONS.
    others: int = 0

    @property
    def total(self) -> int:
        """Every refused connection recorded, named or not."""
        return self.others + sum(d.count for d in self.destinations)


def _bounded(refused: Refused) -> Refused:
    """``refused`` with each text cut to ``REASON_CHARS``: what a record keeps.

    The words' own cut is unchanged, for no template puts a text past that
    many characters of its words.
    """
    return attrs.evolve(
        refused,
        host=refused.host[:REASON_CHARS],
        given=refused.given[:REASON_CHARS],
        address=refused.address[:REASON_CHARS],
        kind=refused.kind[:REASON_CHARS],
        listed=refused.listed[:REASON_CHARS],
    )


def record(refusals: Refusals, host: str, port: int, refused: Refused) -> Refusals:
    """``refusals`` with one more refused connection to ``host:port``."""
    for index, known in enumerate(refusals.destinations):
        if (known.host, known.port) == (host, port):
            counted = attrs.evolve(known, count=known.count + 1)
            destinations = (
                *refusals.destinations[:index],
                counted,
                *refusals.destinations[index + 1 :],
            )
            return attrs.evolve(refusals, destinations=destinations)
    if len(refusals.destinations) >= DESTINATIONS:
        return attrs.evolve(refusals, others=refusals.others + 1)
    added = RefusedDestination(host=host[:253], port=port, refused=_bounded(refused))
    return attrs.evolve(refusals, destinations=(*refusals.destinations, added))
