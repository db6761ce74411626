"""The ``fetch`` and ``search`` subcommands: the web tools from a shell, as a model would see them.

Exit codes: 0 when the result is fine, 1 when it is an error result (a
refusal or a failure the model would see), 2 when the host's settings are
wrong (no search provider configured, a bad allow rule or certificate file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ._terminal import for_terminal

if TYPE_CHECKING:
    import ssl

    from ..web import SearchProvider, WebResult

__all__ = ["register"]

EXIT_OK = 0
EXIT_ERROR_RESULT = 1
EXIT_HOST_ERROR = 2


class _HostError(Exception):
    """The command line or environment is misconfigured."""


def register(subparsers: Any) -> None:
    """Add ``fetch`` and ``search`` to an argparse subparsers object."""
    fetch = subparsers.add_parser(
        "fetch",
        help="fetch a URL as webfetch would and print what the model would see",
        description="Fetch a public page through the egress policy and print it as text.",
    )
    fetch.add_argument("url", help="an http or https URL")
    fetch.add_argument("--json", action="store_true", help="print a JSON object instead")
    fetch.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="RULE",
        help="operator allow rule, such as '127.0.0.1/32 port 8080' (repeatable)",
    )
    fetch.add_argument("--cafile", help="trust the certificates in this PEM file")
    fetch.add_argument("--proxy", help="send through this HTTP proxy (http://host:port)")
    fetch.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole fetch")
    fetch.add_argument(
        "--full-page",
        action="store_true",
        help="the whole page, not its main content (the call's full_page)",
    )
    fetch.add_argument(
        "--link-targets",
        action="store_true",
        help="give the links' targets (the call's link_targets)",
    )
    fetch.add_argument(
        "--links",
        choices=["text", "references", "inline"],
        default="text",
        help="how links are written: their text alone (default), [text][N] with the "
        "targets listed at the end, or [text](URL)",
    )
    fetch.set_defaults(handler=run_fetch)

    search = subparsers.add_parser(
        "search",
        help="search as websearch would and print what the model would see",
        description=(
            "Search with a provider. searxng reads --searxng-url or ASTRALVESSEL_SEARXNG_URL; "
            "brave reads BRAVE_API_KEY; local reads --index-dir."
        ),
    )
    search.add_argument("query")
    search.add_argument("--provider", choices=["searxng", "brave", "local"], default=None)
    search.add_argument("--max-results", type=int, default=None)
    search.add_argument("--searxng-url", default=None)
    search.add_argument("--index-dir", default=None, help="folder of documents for 'local'")
    search.add_argument("--cafile", help="trust the certificates in this PEM file")
    search.add_argument("--json", action="store_true", help="print a JSON object instead")
    search.set_defaults(handler=run_search)


def _context(cafile: str | None) -> ssl.SSLContext | None:
    """The TLS context trusting `cafile` (None: the default); raises _HostError if unreadable."""
    if cafile is None:
        return None
    # ssl costs 15 ms at import: only a command given --cafile pays it at this point.
    import ssl

    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as error:
        raise _HostError(f"cannot read certificates from {cafile}: {error}") from None


def _show(result: WebResult, as_json: bool) -> int:
    if as_json:
        payload = {
            "url": result.url,
            "is_error": result.is_error,
            "status": result.status,
            "content_type": result.content_type,
            "truncated": result.truncated,
            "text": result.text,
        }
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
    else:
        # A page's text is untrusted: its control sequences are shown, not obeyed.
        sys.stdout.write(for_terminal(result.text) + "\n")
    return EXIT_ERROR_RESULT if result.is_error else EXIT_OK


def run_fetch(args: argparse.Namespace) -> int:
    """Run ``astralvessel fetch``."""
    # The web stack is imported by the command that uses it: every CLI start registers this one.
    from ..web import AllowRule, EgressPolicy, Fetcher, FetchLimits, ProxyTransport, StdlibTransport

    try:
        rules = [AllowRule.parse(text) for text in args.allow]
        context = _context(args.cafile)
        transport = (
            ProxyTransport(args.proxy, ssl_context=context)
            if args.proxy
            else StdlibTransport(ssl_context=context)
        )
        limits = FetchLimits(timeout_seconds=args.timeout)
    except (ValueError, _HostError) as error:
        sys.stderr.write(f"astralvessel fetch: {error}\n")
        return EXIT_HOST_ERROR
    fetcher = Fetcher(EgressPolicy(allow=rules), transport, limits=limits, links=args.links)
    result = fetcher.fetch(args.url, full_page=args.full_page, link_targets=args.link_targets)
    return _show(result, args.json)


def _provider(args: argparse.Namespace) -> SearchProvider:
    from ..web import BraveProvider, LocalIndexProvider, SearxngProvider, StdlibTransport

    name = args.provider
    searxng_url = args.searxng_url or os.environ.get("ASTRALVESSEL_SEARXNG_URL")
    if name is None:
        name = "searxng" if searxng_url else "brave" if os.environ.get("BRAVE_API_KEY") else None
        name = name or ("local" if args.index_dir else None)
    if name is None:
        raise _HostError(
            "no search provider configured: pass --provider with --searxng-url, "
            "BRAVE_API_KEY in the environment, or --index-dir"
        )
    context = _context(args.cafile)
    if name == "searxng":
        if not searxng_url:
            raise _HostError("searxng needs --searxng-url or ASTRALVESSEL_SEARXNG_URL")
        return SearxngProvider(searxng_url, transport=StdlibTransport(ssl_context=context))
    if name == "brave":
        key = os.environ.get("BRAVE_API_KEY")
        if not key:
            raise _HostError("brave needs BRAVE_API_KEY in the environment")
        return BraveProvider(key, transport=StdlibTransport(ssl_context=context))
    if not args.index_dir:
        raise _HostError("local needs --index-dir")
    return LocalIndexProvider(args.index_dir)


def run_search(args: argparse.Namespace) -> int:
    """Run ``astralvessel search``."""
    from ..web import Searcher

    try:
        provider = _provider(args)
    except (ValueError, _HostError) as error:
        sys.stderr.write(f"astralvessel search: {error}\n")
        return EXIT_HOST_ERROR
    try:
        result = Searcher(provider).search(args.query, args.max_results)
    finally:
        close = getattr(provider, "close", None)
        if close is not None:
            close()  # the local index holds a database open
    return _show(result, args.json)
