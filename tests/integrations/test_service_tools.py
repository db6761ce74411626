"""Service tools: one POST per call to the operator's service, or a bound Python callable."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio

import astralvessel as av
from astralvessel._tools._pytools import ToolError
from astralvessel.sandbox._base import Sandbox

from ..conftest import MakeAgent
from .conftest import Reply, Service

LOOKUP_TOOL = """
name = "lookup"
description = "Look a species up in the catalogue."
service = "catalog"
timeout_seconds = {timeout}

[parameters]
type = "object"
[parameters.properties.q]
type = "string"
"""


#: The tool's timeout where a test does not wait for it: a loopback POST took over 1 s once on a
#: loaded machine (load 12); the timeout tests set 1 s, which they wait out.
ROOMY_TIMEOUT_S = 30


def _agent(make_agent: MakeAgent, url: str, timeout_s: int = ROOMY_TIMEOUT_S) -> av.Agent:
    folder = make_agent(
        f"""
        tool_output_chars = 200
        [tools]
        declared = ["tools/lookup.toml"]
        [services.catalog]
        url = "{url}"
        """,
        {"tools/lookup.toml": LOOKUP_TOOL.format(timeout=timeout_s)},
    )
    return av.Agent.load(folder)


Caller = Callable[[av.Executor, dict[str, Any]], av.ToolResult]


def _sync(executor: av.Executor, args: dict[str, Any]) -> av.ToolResult:
    with executor.turn() as turn:
        return turn.call("lookup", args)


def _async(executor: av.Executor, args: dict[str, Any]) -> av.ToolResult:
    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("lookup", args)

    return asyncio.run(main())


def _trio(executor: av.Executor, args: dict[str, Any]) -> av.ToolResult:
    async def main() -> av.ToolResult:
        async with executor.turn() as turn:
            return await turn.acall("lookup", args)

    return trio.run(main)


#: Every test of a call runs it sync, on asyncio and on trio.
both = pytest.mark.parametrize("call", [_sync, _async, _trio], ids=["call", "acall", "trio"])


@pytest.fixture
def executor(make_agent: MakeAgent, service: Service, backend: Sandbox) -> av.Executor:
    """An executor whose ``lookup`` tool posts to the loopback service."""
    return av.Executor(av.Registry.for_agent(_agent(make_agent, service.url)), sandbox=backend)


@both
def test_posts_tool_and_arguments(executor: av.Executor, service: Service, call: Caller) -> None:
    """The call is one JSON POST of the tool's name and arguments; the body is the result."""
    service.reply = lambda request: Reply(body=f"found {request['arguments']['q']}".encode())
    result = call(executor, {"q": "otter"})
    assert not result.is_error
    assert result.text == "found otter"
    assert service.requests == [
        {
            "body": {"tool": "lookup", "arguments": {"q": "otter"}},
            "content_type": "application/json",
        }
    ]
    assert service.paths == ["/tools"]


@both
def test_non_2xx_is_an_error_with_status_and_body(
    executor: av.Executor, service: Service, call: Caller
) -> None:
    """A non-2xx answer is an error naming the status and quoting the start of the body."""
    service.reply = lambda _: Reply(status=503, body=b"catalogue is   down\n" + b"z" * 5000)
    result = call(executor, {"q": "otter"})
    assert result.is_error
    assert result.text.startswith(
        "Error: the catalog service answered HTTP 503 Service Unavailable: "
    )
    assert "catalogue is down" in result.text
    assert len(result.text) < 700


@both
def test_redirects_are_not_followed(executor: av.Executor, service: Service, call: Caller) -> None:
    """A redirect is reported as an error and its target is never requested."""
    service.reply = lambda _: Reply(status=307, headers={"Location": "/elsewhere"})
    result = call(executor, {"q": "otter"})
    assert result.is_error
    assert "HTTP 307" in result.text
    assert "redirects are not followed" in result.text
    assert service.paths == ["/tools"]


@both
def test_long_response_is_cut_to_the_output_cap(
    executor: av.Executor, service: Service, call: Caller
) -> None:
    """A body longer than tool_output_chars is cut with a note counting what was dropped."""
    service.reply = lambda _: Reply(body="é".encode() * 1000)
    result = call(executor, {"q": "otter"})
    assert not result.is_error
    assert result.text == "é" * 200 + "\n[output truncated: 800 more characters were dropped]"
    assert result.dropped_chars == 800


@both
def test_slow_service_times_out(
    make_agent: MakeAgent, service: Service, backend: Sandbox, call: Caller
) -> None:
    """A service slower than the tool's timeout gives a timed-out error result."""
    service.reply = lambda _: Reply(body=b"late", delay=3)
    agent = _agent(make_agent, service.url, timeout_s=1)
    result = call(av.Executor(av.Registry.for_agent(agent), sandbox=backend), {"q": "otter"})
    assert result.timed_out
    assert result.is_error
    assert result.text == "[timed out after 1 s]"


@both
def test_empty_body_is_marked(executor: av.Executor, service: Service, call: Caller) -> None:
    """A successful empty answer shows ``[empty response]`` rather than nothing."""
    service.reply = lambda _: Reply(status=204)
    assert call(executor, {"q": "otter"}).text == "[empty response]"


@both
def test_unreachable_service_is_an_error(
    make_agent: MakeAgent, backend: Sandbox, call: Caller
) -> None:
    """A service that refuses connections gives an error result, not an exception."""
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = _agent(make_agent, f"http://127.0.0.1:{port}/tools")
    result = call(av.Executor(av.Registry.for_agent(agent), sandbox=backend), {"q": "x"})
    assert result.is_error
    assert result.text.startswith("Error: the catalog service could not be reached")


@both
def test_bound_callable_replaces_the_post(
    make_agent: MakeAgent, service: Service, backend: Sandbox, call: Caller
) -> None:
    """A callable bound to the service name answers instead, and nothing is posted."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def catalog(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        seen.append((tool, arguments))
        return {"species": [arguments["q"]]}

    agent = _agent(make_agent, service.url)
    executor = av.Executor(
        av.Registry.for_agent(agent), sandbox=backend, services={"catalog": catalog}
    )
    result = call(executor, {"q": "otter"})
    assert json.loads(result.text) == {"species": ["otter"]}
    assert seen == [("lookup", {"q": "otter"})]
    assert service.requests == []


@both
def test_bound_async_callable_errors_and_timeouts(
    make_agent: MakeAgent, service: Service, backend: Sandbox, call: Caller
) -> None:
    """An async bound callable's ToolError is an error result, and it is cancelled at the timeout."""

    async def catalog(tool: str, arguments: dict[str, Any]) -> str:
        if arguments["q"] == "slow":
            await anyio.Event().wait()  # on whichever loop runs the call
        raise ToolError(f"no species called {arguments['q']}")

    agent = _agent(make_agent, service.url, timeout_s=1)
    executor = av.Executor(
        av.Registry.for_agent(agent), sandbox=backend, services={"catalog": catalog}
    )
    refused = call(executor, {"q": "yeti"})
    assert refused.is_error
    assert refused.text == "no species called yeti"
    slow = call(executor, {"q": "slow"})
    assert slow.timed_out
    assert slow.text == "[timed out after 1 s]"


def test_service_without_url_or_callable_raises(backend: Sandbox) -> None:
    """A service tool with neither a [services] url nor a bound callable is the host's error."""
    spec = av.ToolSpec(
        name="lookup", description="Look up.", kind=av.ToolKind.SERVICE, service="catalog"
    )
    executor = av.Executor(av.Registry([spec]), sandbox=backend)
    with executor.turn() as turn, pytest.raises(av.ConfigError, match=r"services\.catalog"):
        turn.call("lookup", {})


def test_example_agent_folders_load(tmp_path: Path) -> None:
    """The service tool file format used in the docs loads as a SERVICE tool."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "lookup.toml").write_text(LOOKUP_TOOL.format(timeout=1))
    (tmp_path / "vessel.toml").write_text(
        '[tools]\ndeclared = ["tools/lookup.toml"]\n'
        '[services.catalog]\nurl = "http://127.0.0.1:8080/tools"\n'
    )
    spec = av.Agent.load(tmp_path).tools[0]
    assert spec.kind is av.ToolKind.SERVICE
    assert spec.service == "catalog"
