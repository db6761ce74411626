"""The webfetch and websearch runners: one step through ``astralvessel.web``.

They run in the host process, never in the sandbox: the web package's policy
decides every address. The turn context carries the fetcher and searcher the
executor built once; what the model sees is ``results.render_page``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs

from .._ground._webfailures import search_failure_words
from ..errors import SearchFailed, SearchWhy
from ..results import ToolResult, render_page
from ._plans import Call, Plan, TurnContext

if TYPE_CHECKING:
    from ..sandbox._base import SandboxSession
    from ..web import WebResult

__all__ = ["plan_webfetch", "plan_websearch"]


@attrs.frozen(kw_only=True)
class WebRun:
    """One fetch or search: the fetcher's or searcher's sync and async twins of one step."""

    step: Callable[[], WebResult]
    astep: Callable[[], Awaitable[WebResult]]
    output_chars: int
    sandboxed: bool = attrs.field(default=False, init=False)

    def run(self, session: SandboxSession | None) -> WebResult:
        return self.step()

    async def arun(self, session: SandboxSession | None) -> WebResult:
        return await self.astep()

    def finish(self, outcome: WebResult) -> ToolResult:
        return render_page(outcome, cap=self.output_chars)

    def rescue(self, exc: Exception) -> ToolResult | None:
        return None


def plan_webfetch(context: TurnContext, call: Call) -> Plan[Any]:
    """Fetch ``url`` through the executor's fetcher, whole when the call sets ``full_page``,
    with its links' targets when it sets ``link_targets``."""
    fetcher, url = context.fetcher, str(call.arguments["url"])
    full_page = call.arguments.get("full_page") is True
    link_targets = call.arguments.get("link_targets") is True
    return WebRun(
        step=lambda: fetcher.fetch(url, full_page=full_page, link_targets=link_targets),
        astep=lambda: fetcher.afetch(url, full_page=full_page, link_targets=link_targets),
        output_chars=context.output_chars,
    )


def plan_websearch(context: TurnContext, call: Call) -> Plan[Any] | ToolResult:
    """Search through the executor's searcher; without one, say that no search ran."""
    searcher = context.searcher
    if searcher is None:
        return ToolResult.error(search_failure_words(SearchFailed(why=SearchWhy.NOT_CONFIGURED)))
    query, count = str(call.arguments["query"]), call.arguments.get("max_results")
    return WebRun(
        step=lambda: searcher.search(query, count),
        astep=lambda: searcher.asearch(query, count),
        output_chars=context.output_chars,
    )
