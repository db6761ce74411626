"""The egress policy: which URLs and addresses a web tool may reach.

Everything here is a pure function over values except `SystemResolver`, the
one place that asks the operating system about names. The `Fetcher` calls
`EgressPolicy.check_url` on every URL (the model's and every redirect target),
resolves the host exactly once with a `Resolver`, then calls
`EgressPolicy.approve` on the answers; the transport connects to the address
that comes back, so a second DNS answer can never redirect the connection.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from typing import Protocol
from urllib.parse import quote, urlsplit

import attrs

from .._ground._urlrefusals import UrlRefused, UrlWhy, url_refusal_words
from ..errors import EgressError, UsageError

__all__ = [
    "AllowRule",
    "Approval",
    "EgressPolicy",
    "Resolver",
    "SystemResolver",
    "Target",
    "classify_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_SCHEMES = ("http", "https")
ALLOWED_PORTS = (80, 443)
DEFAULT_PORTS = {"http": 80, "https": 443}


# Named special-purpose ranges, checked in order, so a refusal can say what the address is.
# Sources: the IANA IPv4 and IPv6 special-purpose address registries (RFC 6890 and later).
_V4_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "an unspecified ('this network') address"),
    ("127.0.0.0/8", "a loopback address"),
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("169.254.0.0/16", "a link-local address (where cloud metadata services live)"),
    ("100.64.0.0/10", "a carrier-grade NAT (CGNAT) address"),
    ("192.0.0.0/24", "an IETF protocol assignment address"),
    ("192.0.2.0/24", "a documentation address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("192.88.99.0/24", "a 6to4 relay anycast address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
)
_V6_RANGES: tuple[tuple[str, str], ...] = (
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("::/96", "an IPv4-compatible address (deprecated)"),
    ("::ffff:0:0:0/96", "an IPv4-translated address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001::/32", "a Teredo tunnel address"),
    ("2001:2::/48", "a benchmarking address"),
    ("2001:db8::/32", "a documentation address"),
    ("3fff::/20", "a documentation address"),
    ("2001:10::/28", "an ORCHID address"),
    ("2001:20::/28", "an ORCHIDv2 address"),
    ("2001::/23", "an IETF protocol assignment address"),
    ("5f00::/16", "a segment routing (SRv6) address"),
    ("fc00::/7", "a private (unique local) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address (deprecated)"),
    ("ff00::/8", "a multicast address"),
)
_V4_TABLE = tuple((ipaddress.IPv4Network(net), why) for net, why in _V4_RANGES)
_V6_TABLE = tuple((ipaddress.IPv6Network(net), why) for net, why in _V6_RANGES)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
# The only IPv6 space IANA gives out for global unicast; everything else is reserved, whatever
# ``ipaddress``'s ``is_global`` says on the running Python (its tables differ between patches).
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

# Host names that resolve to this machine by definition (RFC 6761), refused before any lookup.
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")

_HOST_NAME = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)(\.(?!-)[a-z0-9_-]{1,63}(?<!-))*\.?$")
# WHATWG URL parsing treats a host whose last label is a number as an IPv4 address, so
# anything shaped like that is either the one canonical spelling or refused.
_NUMERIC_LABEL = re.compile(r"^(0[x][0-9a-f]*|[0-9]+)$")
_CANONICAL_V4 = re.compile(
    r"^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$"
)
_FORBIDDEN_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def classify_address(address: IPAddress) -> str | None:  # noqa: PLR0911 - one verdict per rule
    """Say what kind of non-public address this is, or None when it is public.

    IPv6 addresses that embed an IPv4 address (IPv4-mapped, NAT64, 6to4) are
    judged by the address they embed.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            inner = classify_address(embedded)
            return None if inner is None else f"an IPv6 address embedding {embedded}, {inner}"
        if address.scope_id:
            return "a scoped (zone) address"
        for net6, why in _V6_TABLE:
            if address in net6:
                return why
        if address not in _GLOBAL_UNICAST:
            return "a reserved address (outside global unicast, 2000::/3)"
        return None
    for net4, why in _V4_TABLE:
        if address in net4:
            return why
    if address == ipaddress.IPv4Address("255.255.255.255") or not address.is_global:
        return "a reserved address"
    return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 address, if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF)
    return None


def _to_network(value: str | IPNetwork) -> IPNetwork:
    try:
        return ipaddress.ip_network(value)
    except ValueError as error:
        raise UsageError(
            f"invalid allow rule network {value!r}: write a network such as 127.0.0.1/32 ({error})"
        ) from None


def _to_ports(value: Iterable[int]) -> frozenset[int]:
    return frozenset(value)


@attrs.frozen(kw_only=True)
class AllowRule:
    """An operator's exception to the egress policy: a network, and optionally the ports on it.

    Only the host's code can create one; nothing the model sends can add a rule.
    ``ports`` empty means any port.
    """

    network: IPNetwork = attrs.field(converter=_to_network)
    ports: frozenset[int] = attrs.field(default=frozenset(), converter=_to_ports)

    @classmethod
    def parse(cls, text: str) -> AllowRule:
        """Read ``NETWORK`` or ``NETWORK port P[,P...]``, such as ``127.0.0.1/32 port 8443``."""
        network, _, rest = text.strip().partition(" port ")
        try:
            ports = frozenset(int(p) for p in rest.split(",")) if rest.strip() else frozenset()
            return cls(network=network.strip(), ports=ports)
        except ValueError as error:
            raise UsageError(
                f"invalid allow rule {text!r}: write a network such as 127.0.0.1/32, "
                f"optionally followed by ' port 8080,8443' ({error})"
            ) from None

    def matches(self, address: IPAddress, port: int) -> bool:
        """Whether this rule lets a connection to ``address:port`` through."""
        return (
            address.version == self.network.version
            and address in self.network
            and (not self.ports or port in self.ports)
        )


@attrs.frozen(kw_only=True)
class Target:
    """A URL that passed the policy's URL checks, split into what a connection needs."""

    url: str
    scheme: str
    host: str  # canonical ASCII host name, or an IP address without brackets
    port: int
    request_target: str  # path and query, as sent on the request line
    literal: IPAddress | None  # set when the URL names an IP address directly

    @property
    def host_header(self) -> str:
        """The Host header value: the host, bracketed for IPv6, with the port when not default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if DEFAULT_PORTS[self.scheme] == self.port else f"{host}:{self.port}"


@attrs.frozen(kw_only=True)
class Approval:
    """A target and the addresses the policy approved for it, in the resolver's order."""

    target: Target
    addresses: tuple[str, ...]


class Resolver(Protocol):
    """Answers which addresses a host name has; called once per URL by the policy's user."""

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """Return the host's addresses as text; raise OSError when the name does not resolve."""
        ...


class SystemResolver:
    """Resolves names with the operating system's ``getaddrinfo``, once per call."""

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """Return every distinct address ``getaddrinfo`` gives for a TCP connection."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        seen: dict[str, None] = {}
        for _family, _type, _proto, _canon, sockaddr in infos:
            seen.setdefault(str(sockaddr[0]), None)
        return tuple(seen)


def _refuse(
    why: UrlWhy,
    *,
    given: str = "",
    host: str = "",
    port: int = 0,
    address: str = "",
    kind: str = "",
) -> EgressError:
    """The error for a refusal by code: its message is the refusal's one wording."""
    refused = UrlRefused(why=why, given=given, host=host, port=port, address=address, kind=kind)
    return EgressError(url_refusal_words(refused), refused=refused)


def _to_rules(value: Iterable[AllowRule]) -> tuple[AllowRule, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class EgressPolicy:
    """Decides which URLs and addresses the web tools may reach.

    By default only ``http`` and ``https`` URLs without user-info, on ports 80
    and 443, whose every resolved address is public. ``allow`` holds the
    operator's exceptions (networks, optionally with ports); they lift the
    address and port checks for matching addresses and nothing else.
    """

    allow: tuple[AllowRule, ...] = attrs.field(default=(), converter=_to_rules)

    def check_url(self, url: str) -> Target:
        """Check a URL's form; return its target, or raise `EgressError` naming the rule."""
        url = url.strip()
        if len(url) > 8192:
            raise _refuse(UrlWhy.TOO_LONG)
        if _FORBIDDEN_URL_CHARS.search(url):
            raise _refuse(UrlWhy.URL_CHARS)
        try:
            parts = urlsplit(url)
        except ValueError as error:
            raise _refuse(UrlWhy.UNPARSED, given=str(error)) from None
        scheme = parts.scheme.lower()
        if scheme not in ALLOWED_SCHEMES:
            raise _refuse(UrlWhy.SCHEME, given=scheme) if scheme else _refuse(UrlWhy.NO_SCHEME)
        netloc = parts.netloc
        if "@" in netloc:
            raise _refuse(UrlWhy.USER_INFO)
        if netloc.startswith("["):
            raw_host, _, after = netloc.partition("]")
            raw_host += "]"
            if after and not after.startswith(":"):
                raise _refuse(UrlWhy.AFTER_V6)
            port_text = after[1:]
        else:
            raw_host, _, port_text = netloc.partition(":")
        if port_text and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
            raise _refuse(UrlWhy.PORT_TEXT, given=port_text)
        port = int(port_text) if port_text else DEFAULT_PORTS[scheme]
        if port not in ALLOWED_PORTS and not any(
            not rule.ports or port in rule.ports for rule in self.allow
        ):
            # approve() checks the port again against each address's allow rule.
            raise _refuse(UrlWhy.PORT, port=port)
        host, literal = self._canonical_host(raw_host)
        request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # Non-ASCII characters in a path or query go on the wire percent-encoded as UTF-8.
        request_target = _NON_ASCII.sub(lambda m: quote(m.group(0)), request_target)
        return Target(
            url=url,
            scheme=scheme,
            host=host,
            port=port,
            request_target=request_target,
            literal=literal,
        )

    def approve(self, target: Target, answers: Iterable[str]) -> Approval:
        """Check every resolved address; return the approval or raise `EgressError`.

        One refused answer refuses them all: a name that resolves to a public
        and a private address is a DNS rebinding attempt, not a choice.
        """
        addresses: list[str] = []
        for answer in answers:
            try:
                address = ipaddress.ip_address(answer)
            except ValueError:
                raise _refuse(UrlWhy.NOT_AN_ADDRESS, host=target.host, given=answer) from None
            if self._allowed(address, target.port):
                addresses.append(str(address))
                continue
            why = self.judge(address, target.port)
            if why is not None:
                literal = target.literal is not None
                code = UrlWhy.LITERAL_ADDRESS if literal else UrlWhy.RESOLVED_ADDRESS
                raise _refuse(code, host=target.host, address=str(address), kind=why)
            if target.port not in ALLOWED_PORTS:
                raise _refuse(UrlWhy.PORT, port=target.port)
            addresses.append(str(address))
        if not addresses:
            raise _refuse(UrlWhy.NO_ADDRESSES, host=target.host)
        return Approval(target=target, addresses=tuple(addresses))

    def _allowed(self, address: IPAddress, port: int) -> bool:
        return any(rule.matches(address, port) for rule in self.allow)

    def judge(self, address: IPAddress, port: int) -> str | None:
        """Why ``address:port`` is refused (what kind of address it is), or None when allowed.

        The one address rule of webfetch and the egress proxy: an operator's
        ``AllowRule`` admits, otherwise only a public address passes.
        """
        return None if self._allowed(address, port) else classify_address(address)

    def _canonical_host(self, raw: str) -> tuple[str, IPAddress | None]:
        if not raw:
            raise _refuse(UrlWhy.NO_HOST)
        if raw.startswith("["):
            if not raw.endswith("]"):
                raise _refuse(UrlWhy.V6_UNCLOSED)
            inner = raw[1:-1]
            if "%" in inner:
                raise _refuse(UrlWhy.ZONE)
            try:
                v6 = ipaddress.IPv6Address(inner)
            except ValueError:
                raise _refuse(UrlWhy.BAD_V6, given=inner) from None
            return str(v6), v6
        if "%" in raw:
            raise _refuse(UrlWhy.PERCENT)
        try:
            # IDNA folds full-width digits and dots to ASCII, so it runs before the number check.
            host = raw.encode("idna").decode("ascii").lower() if not raw.isascii() else raw.lower()
        except UnicodeError:
            raise _refuse(UrlWhy.BAD_NAME, given=raw) from None
        bare = host[:-1] if host.endswith(".") else host
        labels = bare.split(".")
        if _NUMERIC_LABEL.match(labels[-1]):
            if raw.isascii() and _CANONICAL_V4.match(host):
                v4 = ipaddress.IPv4Address(host)
                return str(v4), v4
            raise _refuse(UrlWhy.ODD_IP, given=raw)
        if not _HOST_NAME.match(host):
            raise _refuse(UrlWhy.BAD_NAME, given=raw)
        if bare in _LOCAL_NAMES or bare.endswith(".localhost"):
            raise _refuse(UrlWhy.LOCAL_NAME, given=raw)
        return bare, None
