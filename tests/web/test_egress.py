"""The egress policy: every refusal, the message the model sees, and that nothing connected."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest
from hypothesis import given, settings

from astralvessel._ground._urlrefusals import UrlRefused, UrlWhy, url_refusal_words
from astralvessel.errors import EgressError
from astralvessel.web import AllowRule, EgressPolicy, Fetcher, StdlibTransport, classify_address
from astralvessel.web._proxyhead import ProxyRefusal, approve_addresses

from .conftest import HOST, LOOPBACK, MapResolver, Server, SpyTransport
from .reserved import SAMPLES, reserved_spellings

RULE = "; webfetch reaches only public addresses on ports 80 and 443."
UNUSUAL = "spells an IP address in an unusual form"

# (URL, DNS answers for its host or None, a phrase the refusal must contain)
HOSTILE: list[tuple[str, Sequence[str] | None, str]] = [
    ("ftp://example.com/file", None, "the scheme 'ftp' is not allowed"),
    ("file:///etc/passwd", None, "the scheme 'file' is not allowed"),
    ("gopher://example.com:70/", None, "the scheme 'gopher' is not allowed"),
    ("javascript:alert(1)", None, "the scheme 'javascript' is not allowed"),
    ("//example.com/", None, "a URL without a scheme is not allowed"),
    ("http://user:secret@example.com/", None, "user-info"),
    ("http://example.com@10.0.0.1/", None, "user-info"),
    ("http://example.com:8080/", None, "port 8080 is not allowed"),
    ("https://example.com:22/", None, "port 22 is not allowed"),
    ("http://example.com:0/", None, "port 0 is not allowed"),
    ("http://example.com:+80/", None, "the port '+80' is not a number"),
    ("http://127.0.0.1/", None, "127.0.0.1 is a loopback address"),
    ("http://10.1.2.3/", None, "10.1.2.3 is a private address"),
    ("http://172.16.0.1/", None, "172.16.0.1 is a private address"),
    ("http://192.168.1.1/", None, "192.168.1.1 is a private address"),
    ("http://169.254.169.254/latest/meta-data/", None, "169.254.169.254 is a link-local address"),
    ("http://100.64.0.1/", None, "100.64.0.1 is a carrier-grade NAT (CGNAT) address"),
    ("http://0.0.0.0/", None, "0.0.0.0 is an unspecified"),
    ("http://224.0.0.1/", None, "224.0.0.1 is a multicast address"),
    ("http://240.0.0.1/", None, "240.0.0.1 is a reserved address"),
    ("http://255.255.255.255/", None, "255.255.255.255 is a reserved address"),
    ("http://192.0.2.1/", None, "192.0.2.1 is a documentation address"),
    ("http://198.18.0.1/", None, "198.18.0.1 is a benchmarking address"),
    ("http://[::1]/", None, "::1 is a loopback address"),
    ("http://[::]/", None, ":: is an unspecified address"),
    ("http://[fe80::1]/", None, "fe80::1 is a link-local address"),
    ("http://[fd00:ec2::254]/", None, "fd00:ec2::254 is a private (unique local) address"),
    ("http://[ff02::1]/", None, "ff02::1 is a multicast address"),
    ("http://[2001:db8::1]/", None, "2001:db8::1 is a documentation address"),
    ("http://[::ffff:127.0.0.1]/", None, "embedding 127.0.0.1, a loopback address"),
    ("http://[::ffff:169.254.169.254]/", None, "embedding 169.254.169.254, a link-local"),
    ("http://[64:ff9b::a9fe:a9fe]/", None, "embedding 169.254.169.254, a link-local"),
    ("http://[2002:c0a8:101::1]/", None, "embedding 192.168.1.1, a private address"),
    ("http://[::127.0.0.1]/", None, "an IPv4-compatible address"),
    ("http://[2001::1]/", None, "a Teredo tunnel address"),
    ("http://[fe80::1%25eth0]/", None, "zone identifiers"),
    ("http://2130706433/", None, UNUSUAL),
    ("http://0x7f000001/", None, UNUSUAL),
    ("http://0177.0.0.1/", None, UNUSUAL),
    ("http://017700000001/", None, UNUSUAL),
    ("http://127.1/", None, UNUSUAL),
    ("http://127.0.0.1./", None, UNUSUAL),
    ("http://0x7f.0.0.1/", None, UNUSUAL),
    ("http://127.000.000.001/", None, UNUSUAL),
    ("http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/", None, UNUSUAL),
    ("http://1.2.3.04/", None, UNUSUAL),
    ("http://localhost/", None, "names this machine"),
    ("http://LOCALHOST./", None, "names this machine"),
    ("http://api.localhost/", None, "names this machine"),
    ("http://%31%32%37.0.0.1/", None, "percent-encoding"),
    ("http://exa mple.com/", None, "spaces, control characters or backslashes"),
    ("http://example.com\\@10.0.0.1/", None, "spaces, control characters or backslashes"),
    ("http://example.com\t/", None, "spaces, control characters or backslashes"),
    ("http://bad_host-.com/", None, "is not a valid host name"),
    ("http:///path", None, "the URL has no host"),
    (
        "http://internal.example/",
        ["10.0.0.5"],
        "internal.example resolves to 10.0.0.5, which is a private",
    ),
    (
        "http://mixed.example/",
        ["93.184.216.34", "127.0.0.1"],
        "resolves to 127.0.0.1, which is a loopback",
    ),
    (
        "http://meta.example/",
        ["169.254.169.254"],
        "resolves to 169.254.169.254, which is a link-local",
    ),
    ("http://v6.example/", ["::1"], "resolves to ::1, which is a loopback"),
    ("http://mapped.example/", ["::ffff:10.0.0.1"], "embedding 10.0.0.1, a private address"),
    ("http://nat64.example/", ["64:ff9b::7f00:1"], "embedding 127.0.0.1, a loopback address"),
    ("http://cgnat.example/", ["100.100.100.200"], "carrier-grade NAT"),
    ("http://garbage.example/", ["not-an-address"], "which is not an IP address"),
    ("http://empty.example/", [], "empty.example has no addresses"),
]


@pytest.mark.parametrize(("url", "answers", "phrase"), HOSTILE, ids=[row[0] for row in HOSTILE])
def test_hostile_url_is_refused_without_connecting(
    url: str, answers: Sequence[str] | None, phrase: str
) -> None:
    """Each hostile URL or DNS answer is refused with its rule, before any connection."""
    host = url.split("//", 1)[-1].split("/", 1)[0]
    resolver = MapResolver({host: answers} if answers is not None else {})
    spy = SpyTransport()
    result = Fetcher(EgressPolicy(), spy, resolver=resolver).fetch(url)
    assert result.is_error
    assert result.text.startswith("refused: ")
    assert result.text.endswith(RULE)
    assert phrase in result.text
    assert spy.requests == []
    # The refusal is a code and its facts, worded once: the result's text is its words.
    assert result.egress is not None
    assert result.text == url_refusal_words(result.egress)


def test_table_is_large_enough() -> None:
    """The table holds at least forty hostile URLs and DNS answers."""
    assert len(HOSTILE) >= 40


@pytest.mark.parametrize(
    "host",
    ["2130706433", "0x7f000001", "127.1", "127.0.0.1.", "0177.0.0.1", "\uff11\uff12\uff17.0.0.1"],
)
def test_odd_spellings_stay_refused_under_an_allow_rule(host: str) -> None:
    """An operator's loopback rule allows 127.0.0.1, never an odd spelling of it."""
    spy = SpyTransport()
    result = Fetcher(EgressPolicy(allow=[LOOPBACK]), spy).fetch(f"http://{host}/")
    assert UNUSUAL in result.text
    assert spy.requests == []


def test_public_then_private_resolver_connects_to_the_first_answer() -> None:
    """Resolved once: a resolver that turns private on its second answer never gets asked again."""
    resolver = MapResolver(
        {"rebind.example": lambda n: ["93.184.216.34"] if n == 0 else ["10.0.0.1"]}
    )
    spy = SpyTransport()  # stands in for the public internet, which tests cannot reach
    result = Fetcher(EgressPolicy(), spy, resolver=resolver).fetch("http://rebind.example/")
    assert not result.is_error, result.text
    assert resolver.calls == ["rebind.example"]
    assert [(r.address, r.host) for r in spy.requests] == [("93.184.216.34", "rebind.example")]


def test_rebinding_resolver_reaches_the_approved_loopback_server(http_server: Server) -> None:
    """A real fetch goes to the first, approved answer even if the name later turns private."""
    resolver = MapResolver({HOST: lambda n: ["127.0.0.1"] if n == 0 else ["10.0.0.1"]})
    spy = SpyTransport(StdlibTransport())
    fetcher = Fetcher(EgressPolicy(allow=[LOOPBACK]), spy, resolver=resolver)
    result = fetcher.fetch(f"http://{HOST}:{http_server.port}/page")
    assert not result.is_error, result.text
    assert resolver.calls == [HOST]
    assert [r.address for r in spy.requests] == ["127.0.0.1"]


def test_rebinding_on_a_redirect_hop_is_refused(http_server: Server) -> None:
    """Each hop resolves afresh and is checked afresh: a rebound second hop is refused."""
    resolver = MapResolver({HOST: lambda n: ["127.0.0.1"] if n == 0 else ["10.0.0.1"]})
    spy = SpyTransport(StdlibTransport())
    fetcher = Fetcher(EgressPolicy(allow=[LOOPBACK]), spy, resolver=resolver)
    result = fetcher.fetch(f"http://{HOST}:{http_server.port}/redirect/1")
    assert result.is_error
    assert "resolves to 10.0.0.1, which is a private address" in result.text
    assert len(spy.requests) == 1
    refused = result.egress
    assert refused is not None
    assert (refused.why, refused.address, refused.origin) == (
        UrlWhy.RESOLVED_ADDRESS,
        "10.0.0.1",
        f"http://{HOST}:{http_server.port}/redirect/1",
    )
    assert result.text == url_refusal_words(refused)
    assert result.text.startswith(f"{refused.origin} redirected to {refused.url}, which was ")


@pytest.mark.parametrize("why", list(UrlWhy))
def test_every_refusal_code_has_its_words_and_the_rule(why: UrlWhy) -> None:
    """Each code is worded, ends with the rule, and the error's message is those words."""
    refused = UrlRefused(why=why, given="g", host="h.test", port=8080, address="::1", kind="k")
    words = url_refusal_words(refused)
    assert words.startswith("refused: ")
    assert words.endswith(RULE)
    assert str(EgressError(words, refused=refused)) == words


def test_check_url_splits_a_plain_url() -> None:
    """A good URL yields its scheme, canonical host, port and request target."""
    target = EgressPolicy().check_url("HTTPS://Example.COM./a/b?q=1#frag")
    assert (target.scheme, target.host, target.port, target.request_target) == (
        "https",
        "example.com",
        443,
        "/a/b?q=1",
    )
    assert target.literal is None


def test_idna_host_is_encoded() -> None:
    """An internationalized host name is sent in its ASCII form."""
    assert EgressPolicy().check_url("http://bücher.example/").host == "xn--bcher-kva.example"


def test_public_literal_is_approved() -> None:
    """A public IP literal needs no resolution and is approved as written."""
    policy = EgressPolicy()
    target = policy.check_url("http://93.184.216.34/")
    assert policy.approve(target, ["93.184.216.34"]).addresses == ("93.184.216.34",)


def test_approve_raises_egress_error() -> None:
    """The policy itself raises EgressError; only the Fetcher turns it into a result."""
    policy = EgressPolicy()
    with pytest.raises(EgressError, match="private address"):
        policy.approve(policy.check_url("http://x.example/"), ["192.168.0.1"])


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::808:808", True),
        ("192.0.0.8", False),
        ("192.88.99.1", False),
        ("100::1", False),
        ("::ffff:0:7f00:1", False),
        ("::ffff:0:808:808", False),
        ("2002:808:808::1", True),
        ("2001:4860::1", True),
        ("2001:1::1", False),
        ("5f00::1", False),
        ("4000::1", False),
    ],
)
def test_classify_address(address: str, public: bool) -> None:
    """Public addresses (also embedded in IPv6) pass; special-purpose ones do not."""
    assert (classify_address(ipaddress.ip_address(address)) is None) is public


def test_allow_rule_parse() -> None:
    """An allow rule reads a network and optional ports."""
    rule = AllowRule.parse("127.0.0.1/32 port 8080,8443")
    assert rule.matches(ipaddress.ip_address("127.0.0.1"), 8443)
    assert not rule.matches(ipaddress.ip_address("127.0.0.1"), 9000)
    assert AllowRule.parse("10.0.0.0/8").matches(ipaddress.ip_address("10.9.9.9"), 1)


def test_allow_rule_parse_rejects_nonsense() -> None:
    """A malformed allow rule is a host error that says how to write one."""
    with pytest.raises(ValueError, match="write a network such as"):
        AllowRule.parse("not a network")


def test_non_ascii_path_is_percent_encoded() -> None:
    """A path with non-ASCII characters is sent percent-encoded as UTF-8."""
    target = EgressPolicy().check_url(" https://de.example/wiki/Fischotter_ü?q=Äsche ")
    assert target.request_target == "/wiki/Fischotter_%C3%BC?q=%C3%84sche"


@settings(max_examples=300, deadline=None)
@given(spelling=reserved_spellings())
def test_reserved_ipv6_is_refused_by_webfetch_and_the_proxy(spelling: str) -> None:
    """Every reserved IPv6 address, however spelled, is refused by the one rule both use:
    as a DNS answer to webfetch, as a literal in webfetch's URL, and as the proxy's answer."""
    policy = EgressPolicy()
    spy = SpyTransport()
    fetched = Fetcher(policy, spy, resolver=MapResolver({HOST: [spelling]})).fetch(
        f"https://{HOST}/"
    )
    literal = Fetcher(policy, spy, resolver=MapResolver({})).fetch(f"http://[{spelling}]/")
    assert fetched.is_error
    assert literal.is_error
    assert fetched.text.startswith("refused: ")
    assert literal.text.startswith("refused: ")
    assert spy.requests == []
    with pytest.raises(ProxyRefusal) as refusal:
        approve_addresses(policy, HOST, 443, [spelling])
    assert refusal.value.status == 403


@pytest.mark.parametrize("spelling", SAMPLES)
def test_each_reserved_kind_is_named(spelling: str) -> None:
    """Each kind of reserved IPv6 address is refused with what it is, not only 'reserved'."""
    why = classify_address(ipaddress.ip_address(spelling))
    assert why is not None
    assert why != "a reserved address"
