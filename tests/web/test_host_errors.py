"""The host's mistakes in configuring the web tools raise UsageError, which is also a ValueError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from astralvessel.errors import UsageError
from astralvessel.web import (
    AllowRule,
    BraveProvider,
    FetchLimits,
    HttpxTransport,
    LocalIndexProvider,
    ProxyTransport,
    SearxngProvider,
)

from .conftest import TLS


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda tls, tmp: FetchLimits(max_bytes=0), "must be positive"),
        (lambda tls, tmp: FetchLimits(timeout_seconds=-1), "must be positive"),
        (lambda tls, tmp: AllowRule(network="not a network"), "such as 127.0.0.1/32"),
        (lambda tls, tmp: AllowRule.parse("10.0.0.0/8 port x"), "such as 127.0.0.1/32"),
        (lambda tls, tmp: ProxyTransport("socks5://proxy:1080"), "http://host:port"),
        (lambda tls, tmp: SearxngProvider("ftp://search.internal"), "http:// or https://"),
        (lambda tls, tmp: BraveProvider(""), "API key"),
        (lambda tls, tmp: LocalIndexProvider(tmp / "missing"), "does not exist"),
        (
            lambda tls, tmp: HttpxTransport(
                ssl_context=tls.client_context(), client=httpx.Client()
            ),
            "not both",
        ),
    ],
)
def test_configuration_mistakes_raise_usage_error(
    build: Callable[[TLS, Path], object], words: str, tls: TLS, tmp_path: Path
) -> None:
    """Each constructor refuses a bad setting with UsageError, saying what to write instead."""
    with pytest.raises(UsageError, match=words) as caught:
        build(tls, tmp_path)
    assert isinstance(caught.value, ValueError)
