"""The webfetch and websearch built-ins: glue between the executor and ``astralvessel.web``.

They run in the host process, never in the sandbox: the web package's policy
decides every address, and these functions only map its results to ToolResults
and keep the output cap without breaking the untrusted-content fence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .results import ToolResult, truncation_note

if TYPE_CHECKING:
    from .executor import Executor
    from .spec import ToolSpec
    from .web import Fetcher, Searcher, WebResult

__all__ = ["aweb_call", "web_call"]

_CLOSING = "\n</web_content>"
_NOT_CONFIGURED = (
    "Error: websearch is not set up in this deployment, so no search ran. This does not "
    "mean nothing exists; answer from what you know or other tools, and say you could not search."
)


def web_call(executor: Executor, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
    """Run webfetch or websearch and return what the model sees."""
    if spec.name == "webfetch":
        return _result(executor, spec, _fetcher(executor).fetch(str(args["url"])))
    searcher = _searcher(executor)
    if searcher is None:
        return ToolResult.error(_NOT_CONFIGURED, tool=spec.name)
    return _result(executor, spec, searcher.search(str(args["query"]), args.get("max_results")))


async def aweb_call(executor: Executor, spec: ToolSpec, args: Mapping[str, Any]) -> ToolResult:
    """Async twin of ``web_call``."""
    if spec.name == "webfetch":
        return _result(executor, spec, await _fetcher(executor).afetch(str(args["url"])))
    searcher = _searcher(executor)
    if searcher is None:
        return ToolResult.error(_NOT_CONFIGURED, tool=spec.name)
    result = await searcher.asearch(str(args["query"]), args.get("max_results"))
    return _result(executor, spec, result)


def _fetcher(executor: Executor) -> Fetcher:
    if executor.fetcher is None:
        from .web import Fetcher

        executor.fetcher = Fetcher()
    fetcher: Fetcher = executor.fetcher
    return fetcher


def _searcher(executor: Executor) -> Searcher | None:
    from .web import Searcher

    configured = executor.searcher
    if configured is None or isinstance(configured, Searcher):
        return configured
    # A bare SearchProvider: wrap it so its results are checked and fenced.
    executor.searcher = Searcher(configured)
    return executor.searcher


def cap_fenced(text: str, limit: int) -> tuple[str, int]:
    """Cut ``text`` to ``limit`` characters, keeping its closing fence; return it and the drop."""
    if len(text) <= limit:
        return text, 0
    fenced = text.endswith(_CLOSING)
    body = text[: -len(_CLOSING)] if fenced else text
    keep = max(0, limit - (len(_CLOSING) if fenced else 0))
    dropped = len(body) - keep
    cut = f"{body[:keep]}\n{truncation_note(dropped)}"
    return (cut + _CLOSING if fenced else cut), dropped


def _result(executor: Executor, spec: ToolSpec, web: WebResult) -> ToolResult:
    text, dropped = cap_fenced(web.text, executor.output_chars)
    metadata = {k: str(v) for k, v in (("url", web.url), ("status", web.status)) if v is not None}
    return ToolResult(
        text=text, is_error=web.is_error, dropped_chars=dropped, tool=spec.name, metadata=metadata
    )
