"""webfetch round trips on loopback: the Fetcher (policy, limits, fence) against urllib.

A threaded HTTP server on 127.0.0.1 serves one plain-text page (HTML to
text has its own benchmark, bench_html.py). The script times
sequential fetches of it through each shipped transport, sync and async, and
the same number of plain ``urllib.request`` GETs (no policy, no conversion)
as the baseline; it prints each one's time per fetch and its ratio to the
baseline (the cost of everything webfetch does on top of one GET).
Run: python bench/bench_fetch.py [--count N] [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from astralvessel.web import AllowRule, EgressPolicy, Fetcher, HttpxTransport, StdlibTransport

PAGE = "".join(
    f"## Holt {n}\n\nOtters fish at dusk along the river: eel, crab, perch.\n\n" for n in range(200)
).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Keep the output to the figures."""

    def do_GET(self) -> None:
        """Serve the page and close."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(PAGE)


class _Pinned:
    """bench.test is the loopback server."""

    def resolve(self, host: str, port: int) -> Sequence[str]:
        """Answer the one name."""
        return ["127.0.0.1"]


def best_time(function: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """Serve the page, time each way of fetching it, and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://bench.test:{port}/page"
    policy = EgressPolicy(allow=[AllowRule(network="127.0.0.1/32")])

    def fetcher(transport: StdlibTransport | HttpxTransport) -> Fetcher:
        return Fetcher(policy, transport, resolver=_Pinned())

    def urllib_gets() -> None:
        for _ in range(args.count):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/page") as response:
                response.read()

    def sync_fetches(transport: StdlibTransport | HttpxTransport) -> Callable[[], None]:
        web = fetcher(transport)

        def go() -> None:
            for _ in range(args.count):
                assert not web.fetch(url).is_error

        return go

    def async_fetches(transport: StdlibTransport | HttpxTransport) -> Callable[[], None]:
        web = fetcher(transport)

        async def fetch_all() -> None:
            for _ in range(args.count):
                assert not (await web.afetch(url)).is_error

        return lambda: asyncio.run(fetch_all())

    try:
        baseline = best_time(urllib_gets, args.repeat)
        print(f"page: {len(PAGE) / 1024:.1f} KB of text, {args.count} sequential fetches per run")
        print(f"urllib GET (baseline):     {baseline / args.count * 1000:.2f} ms per fetch")
        cases = {
            "stdlib fetch": sync_fetches(StdlibTransport()),
            "stdlib afetch": async_fetches(StdlibTransport()),
            "httpx fetch": sync_fetches(HttpxTransport()),
            "httpx afetch": async_fetches(HttpxTransport()),
        }
        for name, run in cases.items():
            took = best_time(run, args.repeat)
            print(
                f"{name + ':':<26} {took / args.count * 1000:.2f} ms per fetch"
                f"  (ratio to baseline {took / baseline:.2f})"
            )
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
