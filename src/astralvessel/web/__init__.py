"""Web tools: `webfetch` and `websearch`, behind an egress policy the model cannot talk past.

The library owns every decision (`EgressPolicy`, redirects, limits, HTML to
text, the untrusted-content fence); a `Transport` performs exactly one HTTP
exchange with the address the policy approved. Search goes through a
`SearchProvider` the deployment chooses.
"""

from __future__ import annotations

from ._content import Fenced as Fenced
from ._content import fence as fence
from ._egress import AllowRule as AllowRule
from ._egress import Approval as Approval
from ._egress import EgressPolicy as EgressPolicy
from ._egress import Resolver as Resolver
from ._egress import SystemResolver as SystemResolver
from ._egress import Target as Target
from ._egress import classify_address as classify_address
from ._fetch import Fetcher as Fetcher
from ._fetch import FetchLimits as FetchLimits
from ._fetch import WebResult as WebResult
from ._html import html_to_text as html_to_text
from ._httpx import HttpxTransport as HttpxTransport
from ._links import LinkStyle as LinkStyle
from ._local import LocalIndexProvider as LocalIndexProvider
from ._search import BraveProvider as BraveProvider
from ._search import Searcher as Searcher
from ._search import SearchError as SearchError
from ._search import SearchHit as SearchHit
from ._search import SearchProvider as SearchProvider
from ._search import SearxngProvider as SearxngProvider
from ._stdlib import ProxyTransport as ProxyTransport
from ._stdlib import StdlibTransport as StdlibTransport
from ._transport import AsyncHttpResponse as AsyncHttpResponse
from ._transport import AsyncTransport as AsyncTransport
from ._transport import HttpRequest as HttpRequest
from ._transport import HttpResponse as HttpResponse
from ._transport import Transport as Transport
from ._transport import TransportError as TransportError

__all__ = [
    "AllowRule",
    "Approval",
    "AsyncHttpResponse",
    "AsyncTransport",
    "BraveProvider",
    "EgressPolicy",
    "Fenced",
    "FetchLimits",
    "Fetcher",
    "HttpRequest",
    "HttpResponse",
    "HttpxTransport",
    "LinkStyle",
    "LocalIndexProvider",
    "ProxyTransport",
    "Resolver",
    "SearchError",
    "SearchHit",
    "SearchProvider",
    "Searcher",
    "SearxngProvider",
    "StdlibTransport",
    "SystemResolver",
    "Target",
    "Transport",
    "TransportError",
    "WebResult",
    "classify_address",
    "fence",
    "html_to_text",
]
