"""Type-checked only (by ``nox -s typing``): uses the public API as a host would.

If a change breaks this file's types, it breaks our users' code.
"""

from __future__ import annotations

from pathlib import Path

import astralvessel as av
from astralvessel.sandbox import Limits, Mount, Policy, Promise, Sandbox


def embed(agent_dir: Path, data: Path, backend: Sandbox) -> list[str]:
    agent: av.Agent = av.Agent.load(agent_dir)
    registry = av.Registry.for_agent(agent)
    schemas: list[dict[str, object]] = registry.schemas("anthropic", scopes=[av.Scope.READ])
    executor = av.Executor(registry, sandbox=backend, mounts={"/data": data}, scopes=["tools:read"])
    texts = [str(s["name"]) for s in schemas]
    with executor.turn() as turn:
        result: av.ToolResult = turn.call("species", '{"habitat": "rivers"}')
        texts.append(result.text)
        flag: bool = result.is_error
        code: int | None = result.exit_code
        _ = (flag, code, result.dropped_chars, result.timed_out, result.files, result.duration)
    return texts


async def embed_async(executor: av.Executor) -> av.ToolResult:
    async with executor.turn() as turn:
        return await turn.acall("species", {"habitat": "lakes"})


def policy_values(data: Path) -> str:
    policy = Policy(mounts=(Mount.from_pair("/data", data),), limits=Limits(disk_mb=64))
    return policy.relax(Promise.MEMORY_LIMIT).identity


def errors() -> None:
    try:
        av.Agent.load("nowhere")
    except av.ConfigError as exc:
        problems: tuple[str, ...] = exc.problems
        _ = problems


def web_and_services(registry: av.Registry, folder: Path) -> av.Executor:
    from astralvessel.web import EgressPolicy, Fetcher, LocalIndexProvider, StdlibTransport

    def lookup(tool: str, arguments: dict[str, object]) -> str:
        return f"{tool}: {arguments}"

    executor = av.Executor(
        registry,
        mounts={"/data": f"{folder}:ro", "/out": f"{folder}:rw"},
        fetcher=Fetcher(EgressPolicy()),
        searcher=LocalIndexProvider(folder),
        services={"catalog": lookup},
        service_transport=StdlibTransport(),
    )
    fetcher: Fetcher = executor.fetcher
    _ = fetcher
    return executor


def page_text(html: str) -> str:
    from astralvessel.web import Fetcher, LinkStyle, WebResult, html_to_text

    style: LinkStyle = "references"
    whole: WebResult = Fetcher(main_content=False, links=style).fetch("https://a.example/")
    article: WebResult = Fetcher().fetch("https://a.example/", full_page=True)
    targets: WebResult = Fetcher(links="text").fetch("https://a.example/", link_targets=True)
    _ = (whole, article, targets)
    return html_to_text(html, "https://a.example/", main_content=True, links="text")


def host_errors(turn: av.Turn) -> None:
    try:
        turn.call("anything")
    except av.TurnClosedError as closed:
        runtime: RuntimeError = closed
        _ = runtime
    try:
        Mount(source=Path("."), target="/data")
    except av.UsageError as usage:
        value: ValueError = usage
        _ = value
    refused: ValueError = av.SnapshotError("a snapshot refused")
    _ = refused


def warm_turns(registry: av.Registry, backend: Sandbox) -> bool:
    with av.Executor(registry, sandbox=backend, warm=4) as executor:
        filled: bool = executor.wait_warm(timeout=30.0)
        with executor.turn() as turn:
            turn.call("species", {"habitat": "rivers"})
    return filled


async def warm_turns_async(registry: av.Registry) -> None:
    async with av.Executor(registry, warm=2) as executor, executor.turn() as turn:
        await turn.acall("species", {})
    await executor.aclose()


def testing_kit(registry: av.Registry) -> list[str]:
    from astralvessel.testing import (
        FakeCall,
        FakeRun,
        FakeSandbox,
        ScriptedModel,
        ToolAnswer,
        tool_call,
    )

    def species(call: FakeCall) -> str | FakeRun:
        return FakeRun(output=str(call.arguments), exit_code=1) if call.stdin else "[]"

    fake = FakeSandbox(
        tools={"species": species, "grep": "a.md:1:otter\n"},
        bash={"ls": FakeRun(output="a\n", files={"r.txt": b"x"})},
        files={"/data/a.md": "otter\n"},
        default=FakeRun(exit_code=127, timed_out=False),
        registry=registry,
    )
    executor = av.Executor(registry, sandbox=fake)
    with executor.turn() as turn:
        turn.call("species", {})
    calls: list[FakeCall] = fake.calls_to("species")
    argv: tuple[str, ...] = calls[0].argv
    model = ScriptedModel("anthropic", [tool_call("species", {"habitat": "rivers"}), "done"])
    reply: dict[str, object] = model.messages.create(messages=[], tools=[])
    answers: list[ToolAnswer] = model.answers()
    return [*argv, str(reply), *(a.text for a in answers), str(fake.open_sessions)]


def frameworks(executor: av.Executor) -> None:
    """The framework integrations and adapter budgets, as a host writes them."""
    from langchain_core.tools import StructuredTool
    from pydantic_ai.toolsets import AbstractToolset

    from astralvessel.adapters import MediaBudget
    from astralvessel.adapters.anthropic import run_tool_calls
    from astralvessel.integrations.langchain import structured_tools
    from astralvessel.integrations.openai_agents import function_tools
    from astralvessel.integrations.pydantic_ai import VesselToolset

    strict: list[dict[str, object]] = executor.registry.schemas("openai-responses", strict=True)
    budget = MediaBudget(max_files=2, max_file_bytes=1 << 20)
    agents_tools = function_tools(executor, strict=False, budget=budget)
    toolset: AbstractToolset[object] = VesselToolset(executor, budget=MediaBudget.text_only())
    with executor.turn() as turn:
        tools: list[StructuredTool] = structured_tools(turn, budget=budget)
        message: dict[str, object] = run_tool_calls(turn, {"content": []}, budget=budget)
    _ = (strict, agents_tools, toolset, tools, message)


def snapshots(registry: av.Registry, saved: Path) -> list[av.Turn]:
    with av.Executor(registry, snapshot_budget_mb=512) as executor, executor.turn() as turn:
        snapshot: av.TurnSnapshot = turn.snapshot()
        snapshot.save(saved)
        loaded = av.TurnSnapshot.load(saved, max_bytes=1 << 30, max_files=10_000)
        ids: tuple[str, int, int] = (loaded.content_id, loaded.total_bytes, loaded.file_count)
        del ids
        with av.Executor(registry, warm=2, snapshot=loaded) as warm, warm.turn() as ready:
            ready.call("bash", {"command": "ls"})
        return [executor.turn(snapshot=snapshot), *turn.fork(8), *turn.fork(4, ready=4)]


async def snapshots_async(turn: av.Turn) -> list[av.Turn]:
    snapshot = await turn.asnapshot()
    assert snapshot == turn.snapshot()
    return [*await turn.afork(2), *await turn.afork(2, ready=0)]


def observed(registry: av.Registry, folder: Path) -> list[av.Outcome]:
    def redact(record: dict[str, object]) -> dict[str, object] | None:
        return record

    ledger = av.Ledger(target=folder, redact=redact, max_chars=4096)
    executor = av.Executor(registry, ledger=ledger)
    with executor.turn() as turn:
        turn_id: str = turn.turn_id
        outcome: av.Outcome = turn.call("species", {"habitat": "rivers"}).outcome
        ran: av.Outcome = turn.exec(["true"]).outcome
    masked = outcome is av.Outcome.SANDBOX_LOST
    _ = (turn_id, masked, av.Executor(registry, ledger=folder), av.Executor(registry, ledger=print))
    return [outcome, ran]
