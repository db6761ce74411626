"""The egress proxy's head reader against arbitrary and near-valid request heads.

Whatever bytes a call sends, ``read_request`` either admits a request to a
listed host on a listed port, or refuses it with a status and a reason: it
never raises anything else, and never admits what the list does not name.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from astralvessel._ground._netallow import parse_allow_list, permits
from astralvessel.web._proxyhead import ProxyLimits, ProxyRefusal, ProxyRequest, read_request

BUDGET = settings(max_examples=600, deadline=None, derandomize=True, database=None)
ALLOW = parse_allow_list(["pypi.org", "*.pythonhosted.org", "git.test:8443"])
LIMITS = ProxyLimits()

HOSTS = st.sampled_from(
    [
        "pypi.org",
        "PyPI.org.",
        "files.pythonhosted.org",
        "pythonhosted.org",
        "git.test",
        "evil.test",
        "127.0.0.1",
        "[::1]",
        "0x7f.1",
        "pypi.org@evil.test",
        "evil.test#@pypi.org",
        "pypi.org%2f@x",
        "",
    ]
)
PORTS = st.sampled_from(["", ":80", ":443", ":8443", ":0", ":65536", ":-1", ": 80", ":80:80"])
METHODS = st.sampled_from([b"GET", b"CONNECT", b"POST", b"get", b"G\x00T", b""])
FIELDS = st.lists(
    st.tuples(
        st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"X", b"Bad Name"]),
        st.binary(max_size=20),
    ),
    max_size=5,
)


def _decide(head: bytes) -> ProxyRequest | ProxyRefusal:
    try:
        return read_request(head, ALLOW, LIMITS)
    except ProxyRefusal as refusal:
        return refusal


def _check(head: bytes) -> None:
    verdict = _decide(head)
    if isinstance(verdict, ProxyRefusal):
        assert verdict.status in {400, 403, 431}
        assert verdict.reason
    else:
        assert permits(ALLOW, verdict.host, verdict.port)


@BUDGET
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_admitted_or_refused(head):
    """Any bytes at all: a listed request or a refusal, never another exception."""
    _check(head)


@BUDGET
@given(method=METHODS, host=HOSTS, port=PORTS, path=st.binary(max_size=20), fields=FIELDS)
def test_near_valid_heads_never_admit_an_unlisted_host(method, host, port, path, fields):
    """Heads built from tricky hosts, ports and fields never reach a host the list does not name."""
    authority = (host + port).encode("latin-1")
    target = authority if method == b"CONNECT" else b"http://" + authority + b"/" + path
    lines = [method + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in fields]
    _check(b"\r\n".join(lines) + b"\r\n\r\n")
