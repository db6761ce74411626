"""webfetch and websearch through a turn on a trio host, against the real loopback servers."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import astralvessel as av
from astralvessel.web import Fetcher, LocalIndexProvider

from .conftest import HOST, Server

SPECIES = Path(__file__).parents[2] / "examples" / "sample-data" / "species"


def _executor(
    fetcher: Fetcher | None = None, searcher: LocalIndexProvider | None = None
) -> av.Executor:
    registry = av.Registry()
    registry.add_builtin("webfetch")
    registry.add_builtin("websearch")
    return av.Executor(registry, sandbox="unconfined", fetcher=fetcher, searcher=searcher)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_trio_awaits_webfetch(
    scheme: str, fetcher: Fetcher, http_server: Server, https_server: Server
) -> None:
    """Under trio, ``acall("webfetch")`` fetches a page over plain HTTP and over TLS, with
    its link targets when the call asks."""
    server = http_server if scheme == "http" else https_server
    url = f"{scheme}://{HOST}:{server.port}/page"

    async def main() -> av.ToolResult:
        async with _executor(fetcher).turn() as turn:
            return await turn.acall("webfetch", {"url": url, "link_targets": True})

    result = trio.run(main)
    assert not result.is_error, result.text
    assert result.text.startswith(f'<web_content source="{url}">')
    assert "# Otters\n\nOtters live in [rivers][1]" in result.text
    assert "steal()" not in result.text


def test_trio_awaits_websearch() -> None:
    """Under trio, ``acall("websearch")`` asks the local index in a worker thread."""

    async def main() -> av.ToolResult:
        with LocalIndexProvider(SPECIES) as provider:
            async with _executor(searcher=provider).turn() as turn:
                return await turn.acall("websearch", {"query": "spraints", "max_results": 3})

    result = trio.run(main)
    assert not result.is_error, result.text
    assert "otter" in result.text.lower()


def test_trio_cancels_a_fetch_and_the_turn_goes_on(fetcher: Fetcher, http_server: Server) -> None:
    """A trio cancel ends a fetch of an endless page at once; the next fetch works."""
    base = f"http://{HOST}:{http_server.port}"
    finished: list[av.ToolResult] = []

    async def main() -> tuple[bool, av.ToolResult]:
        async with _executor(fetcher).turn() as turn:

            async def endless() -> None:
                finished.append(await turn.acall("webfetch", {"url": f"{base}/slow"}))

            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(endless)
                    while not any(path == "/slow" for path, _ in http_server.requests):
                        await trio.sleep(0.01)  # the server is trickling the page to us
                    scope.cancel()
            return scope.cancelled_caught, await turn.acall("webfetch", {"url": f"{base}/page"})

    cancelled, after = trio.run(main)
    assert cancelled
    assert finished == []  # the fetch's own 10 s deadline did not end it
    assert not after.is_error, after.text
    assert "# Otters\n\nOtters live in rivers." in after.text
