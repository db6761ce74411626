"""The egress proxy's decisions, as pure functions over bytes and values.

``read_request`` turns a request head a call sent to the proxy into a
``ProxyRequest`` (a CONNECT tunnel, or an absolute-form ``http://`` request
rewritten for the origin), or raises ``ProxyRefusal`` with the status and the
reason by code (``_refusals.Refused``, worded there once for the reply and the
call's notes). ``approve_addresses`` applies webfetch's address
rule to what the name resolved to. ``refusal_bytes`` is the whole reply to a
refused request. Nothing here does I/O; ``_proxy`` is the shell that does.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

import attrs

from .._ground._netallow import HostPattern, permits
from .._ground._refusals import RULE, Refused, Why, refusal_words
from ._egress import EgressPolicy

__all__ = [
    "CHUNKED",
    "RULE",
    "TUNNEL_PEEK",
    "ProxyLimits",
    "ProxyRefusal",
    "ProxyRequest",
    "approve_addresses",
    "chunk_size",
    "read_request",
    "refusal_bytes",
    "tunnel_refusal",
]

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
_METHOD = re.compile(rb"^[A-Z]{1,16}$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(r"^[0-9]{1,5}$")
_NAME = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)(\.(?!-)[a-z0-9_-]{1,63}(?<!-))*$")
_TARGET_CHARS = re.compile(rb"^[\x21-\x7e]+$")
_LENGTH = re.compile(rb"^[0-9]{1,18}$")
_CHUNK_LINE = re.compile(rb"^([0-9A-Fa-f]{1,15})(;[^\r\n]*)?\r\n$")
#: A TLS record carrying a handshake (RFC 8446 5.1): type 22, then a 3.x version.
_TLS_HANDSHAKE = (0x16, 0x03)
#: The bytes of a tunnel the proxy reads before it passes any on: a TLS record's header.
TUNNEL_PEEK = 5
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never passed to the origin.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
    }
)
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@attrs.frozen(kw_only=True)
class ProxyLimits:
    """The proxy's bounds for one turn: what one call, or all of a turn's calls, may use.

    ``head_bytes`` and ``head_seconds`` bound a request head (a slow or endless
    one is cut off); ``connect_seconds`` bounds reaching the origin;
    ``idle_seconds`` closes a connection on which nothing moved; ``concurrent``,
    ``connections`` and ``total_bytes`` bound the turn as a whole.
    """

    head_bytes: int = attrs.field(default=32 * 1024, validator=attrs.validators.gt(0))
    head_fields: int = attrs.field(default=100, validator=attrs.validators.gt(0))
    head_seconds: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    connect_seconds: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    idle_seconds: float = attrs.field(default=120.0, validator=attrs.validators.gt(0))
    concurrent: int = attrs.field(default=32, validator=attrs.validators.gt(0))
    connections: int = attrs.field(default=2048, validator=attrs.validators.gt(0))
    total_bytes: int = attrs.field(default=4 << 30, validator=attrs.validators.gt(0))


class ProxyRefusal(Exception):
    """A request the proxy will not serve: the HTTP status and why (a ``Refused``).

    ``host`` and ``port`` name the destination once the request named one the
    proxy could read ("" and 0 before), for the call's result and the host's log.
    """

    def __init__(self, status: int, refused: Refused, *, host: str = "", port: int = 0) -> None:
        self.reason = refusal_words(refused)
        super().__init__(self.reason)
        self.status = status
        self.refused = refused
        self.host = host
        self.port = port


@attrs.frozen(kw_only=True)
class ProxyRequest:
    """A request the allow-list admits: where to connect, and what to send first.

    For a tunnel (CONNECT) ``head`` is empty and the proxy answers 200 itself;
    for a plain request it is the head rewritten for the origin (origin-form
    target, the URL's own Host, ``Connection: close``, no proxy headers), and
    ``body`` says how much of what follows is that request's: the proxy passes
    on exactly that, and nothing after it (a pipelined or smuggled request
    would reach the origin with a Host the call chose).
    """

    host: str
    port: int
    tunnel: bool
    head: bytes = b""
    #: The body that follows a plain request's head: its length, or chunked (-1).
    body: int = 0


#: ``ProxyRequest.body`` of a chunked body.
CHUNKED = -1


def refusal_bytes(status: int, reason: str) -> bytes:
    """The whole reply to a refused request: a status, the reason as text, and close."""
    body = f"astralvessel egress proxy: {reason}\n".encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Refused')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _authority(text: str, *, default_port: int | None) -> tuple[str, int]:
    """Split ``host[:port]`` into a canonical host name and a port, or refuse."""
    if "@" in text:
        raise ProxyRefusal(403, Refused(why=Why.USER_INFO))
    if text.startswith("["):
        raise ProxyRefusal(403, Refused(why=Why.IP_ADDRESS, host=text[:100]), host=text[:100])
    host, sep, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not sep:
        if default_port is None:
            raise ProxyRefusal(400, Refused(why=Why.NO_PORT, given=text))
        port = default_port
    elif not _PORT.match(port_text) or not 0 < int(port_text) <= 65535:
        raise ProxyRefusal(400, Refused(why=Why.BAD_PORT, given=port_text))
    else:
        port = int(port_text)
    host = host.lower()
    host = host[:-1] if host.endswith(".") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        raise ProxyRefusal(403, Refused(why=Why.IP_ADDRESS, host=host), host=host, port=port)
    if len(host) > 253 or not _NAME.match(host):
        raise ProxyRefusal(400, Refused(why=Why.NOT_A_NAME, given=host[:100]))
    if host.rsplit(".", 1)[-1].isdigit():
        raise ProxyRefusal(403, Refused(why=Why.SPELLS_IP, host=host), host=host, port=port)
    return host, port


def _check_allowed(allow: Sequence[HostPattern], host: str, port: int) -> None:
    if permits(allow, host, port):
        return
    listed = ", ".join(str(p) for p in allow[:20]) + (", ..." if len(allow) > 20 else "")
    refused = Refused(why=Why.NOT_LISTED, host=host, port=port, listed=listed)
    raise ProxyRefusal(403, refused, host=host, port=port)


def _fields(lines: list[bytes], limits: ProxyLimits) -> list[tuple[bytes, bytes]]:
    if len(lines) > limits.head_fields:
        raise ProxyRefusal(431, Refused(why=Why.TOO_MANY_FIELDS, limit=limits.head_fields))
    fields: list[tuple[bytes, bytes]] = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise ProxyRefusal(400, Refused(why=Why.FIELD_LINE))
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise ProxyRefusal(400, Refused(why=Why.FIELD_CONTROLS))
        fields.append((name, value))
    return fields


def read_request(head: bytes, allow: Sequence[HostPattern], limits: ProxyLimits) -> ProxyRequest:
    """Decide a request head (everything up to and including the blank line)."""
    if len(head) > limits.head_bytes:
        raise ProxyRefusal(431, Refused(why=Why.HEAD_TOO_LONG, limit=limits.head_bytes))
    if not head.endswith(b"\r\n\r\n"):
        raise ProxyRefusal(400, Refused(why=Why.HEAD_UNENDED))
    request_line, *lines = head[:-4].split(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not _METHOD.match(parts[0]) or not _VERSION.match(parts[2]):
        raise ProxyRefusal(400, Refused(why=Why.REQUEST_LINE))
    method, target, version = parts
    if not _TARGET_CHARS.match(target):
        raise ProxyRefusal(400, Refused(why=Why.TARGET_CHARS))
    fields = _fields(lines, limits)
    text = target.decode("ascii")
    if method == b"CONNECT":
        host, port = _authority(text, default_port=None)
        _check_allowed(allow, host, port)
        if port == 80:
            # A tunnel carries plain HTTP with whatever Host the call writes in it.
            raise ProxyRefusal(
                403, Refused(why=Why.CONNECT_PORT_80, host=host), host=host, port=port
            )
        return ProxyRequest(host=host, port=port, tunnel=True)
    if text.lower().startswith("https://"):
        raise ProxyRefusal(400, Refused(why=Why.HTTPS_UNTUNNELLED))
    if not text.lower().startswith("http://"):
        raise ProxyRefusal(400, Refused(why=Why.NOT_PROXY_FORM))
    rest = text[len("http://") :]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    authority, path = (rest, "/") if cut < 0 else (rest[:cut], rest[cut:])
    path = path.split("#", 1)[0]
    if path.startswith("?"):
        path = "/" + path
    host, port = _authority(authority, default_port=80)
    _check_allowed(allow, host, port)
    body = _body(fields, host, port)
    host_header = host if port == 80 else f"{host}:{port}"
    out = [method + b" " + path.encode("ascii") + b" " + version]
    out.append(b"Host: " + host_header.encode("ascii"))
    out += [n + b": " + v for n, v in fields if n.lower() not in _HOP_BY_HOP]
    out.append(b"Connection: close")
    head = b"\r\n".join(out) + b"\r\n\r\n"
    return ProxyRequest(host=host, port=port, tunnel=False, head=head, body=body)


def _body(fields: list[tuple[bytes, bytes]], host: str, port: int) -> int:
    """How the request's body is framed: its length, or ``CHUNKED``; refuse anything else."""
    lengths = [v for n, v in fields if n.lower() == b"content-length"]
    codings = [v for n, v in fields if n.lower() == b"transfer-encoding"]
    if len(lengths) + len(codings) > 1:
        raise ProxyRefusal(400, Refused(why=Why.FRAMED_TWICE), host=host, port=port)
    if codings:
        if codings[0].lower() != b"chunked":
            raise ProxyRefusal(400, Refused(why=Why.TRANSFER_CODING), host=host, port=port)
        return CHUNKED
    if lengths and not _LENGTH.match(lengths[0]):
        raise ProxyRefusal(400, Refused(why=Why.BAD_LENGTH), host=host, port=port)
    return int(lengths[0]) if lengths else 0


def chunk_size(line: bytes) -> int:
    """The size a chunk's line (``SIZE[;ext] CRLF``) gives; raise ``ProxyRefusal`` (400)."""
    match = _CHUNK_LINE.match(line)
    if match is None:
        raise ProxyRefusal(400, Refused(why=Why.CHUNK_LINE))
    return int(match.group(1), 16)


def tunnel_refusal(first: bytes, host: str, port: int) -> ProxyRefusal | None:
    """Why a tunnel whose first bytes are ``first`` is closed (None: TLS, passed on).

    A tunnel carries only TLS: plain HTTP in it would reach any virtual host
    on the listed name's address, with the Host the call wrote.
    """
    if tuple(first[:2]) == _TLS_HANDSHAKE:
        return None
    return ProxyRefusal(400, Refused(why=Why.NO_TLS, host=host, port=port), host=host, port=port)


def approve_addresses(
    egress: EgressPolicy, host: str, port: int, answers: Iterable[str]
) -> tuple[str, ...]:
    """The addresses to try for ``host``, by webfetch's rule; raise ``ProxyRefusal`` (403).

    The allow-list already decided the port; the address rule is webfetch's:
    every answer must be public (or match one of the operator's ``AllowRule``
    exceptions), and one refused answer refuses them all (DNS rebinding).
    """
    addresses: list[str] = []
    for answer in answers:
        try:
            address = ipaddress.ip_address(answer)
        except ValueError:
            refused = Refused(why=Why.NOT_AN_ADDRESS, host=host, given=answer)
            raise ProxyRefusal(502, refused, host=host, port=port) from None
        why = egress.judge(address, port)
        if why is not None:
            refused = Refused(why=Why.ADDRESS_REFUSED, host=host, address=str(address), kind=why)
            raise ProxyRefusal(403, refused, host=host, port=port)
        addresses.append(str(address))
    if not addresses:
        raise ProxyRefusal(502, Refused(why=Why.NO_ADDRESSES, host=host), host=host, port=port)
    return tuple(addresses)
