"""A wrong value for any of Executor's arguments raises one UsageError naming it, at once.

Before these checks many were taken as they came and failed far from their cause,
or never: ``timeout_seconds="5"`` as a TypeError in the session, ``output_chars="5"``
as a sandbox that "died", ``limits={...}`` inside attrs, ``mounts="/data=..."`` as
one mount per character, ``timeout_seconds=-1`` as every call timing out at once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry, ToolSpec, UsageError
from astralvessel.testing import FakeSandbox

EXAMPLE = Path(__file__).parents[2] / "examples" / "field-guide"

WRONG = {
    "registry": [None, "examples/field-guide"],
    "mounts": ["/data=somewhere", ["/data"], {"/data": None}, {5: "."}, 7],
    "scopes": ["tools:read", [5]],
    "limits": [{"disk_mb": 64}],
    "relax": ["no-network", ["no-such-promise"]],
    "timeout_seconds": ["5", -1, 0.0, float("nan"), float("inf"), True],
    "output_chars": ["5", -5, 1.5, False],
    "outbox_dir": [5, ""],
    "services": [["lookup"], {"lookup": "not callable"}],
    "fetcher": [5],
    "searcher": ["duckduckgo"],
    "writable_root": ["yes", 1],
    "root_identity": ["no"],
    "tool_servers": [0],
}


@pytest.mark.parametrize(
    ("argument", "value"),
    [(argument, value) for argument, values in WRONG.items() for value in values],
    ids=repr,
)
def test_a_wrong_argument_raises_usage_error_naming_it(argument: str, value: object) -> None:
    registry = Registry.for_agent(Agent.load(EXAMPLE))
    given: dict[str, object] = {"registry": registry, "sandbox": FakeSandbox(), argument: value}
    with pytest.raises(UsageError) as raised:
        Executor(**given)  # type: ignore[arg-type]
    # The message names what was wrong: the argument, or the one value of it that was.
    named = (argument.removesuffix("s"), "promise", "scope", "sandbox path", "host path")
    assert any(word in str(raised.value).lower() for word in named), str(raised.value)


def test_the_right_types_are_still_taken() -> None:
    """Each argument's accepted forms: a Path host folder, Scope members, promise names."""
    from astralvessel import Scope
    from astralvessel.sandbox import Limits, Mount, Promise

    registry = Registry.for_agent(Agent.load(EXAMPLE))
    executor = Executor(
        registry,
        sandbox=FakeSandbox(),
        mounts={"/data": EXAMPLE.parent / "sample-data"},
        scopes=[Scope.READ, "tools:files"],
        limits=Limits(disk_mb=32),
        relax=[Promise.SECCOMP, "no-ipc"],
        timeout_seconds=5,
        output_chars=100,
        outbox_dir=Path("outbox"),
        services={"lookup": len},
        writable_root=False,
    )
    assert executor.timeout_seconds == 5.0
    assert executor.scopes == {Scope.READ, Scope.FILES}
    assert executor.policy.relaxed == {Promise.SECCOMP, Promise.NO_IPC}
    assert Executor(registry, sandbox=FakeSandbox(), mounts=[Mount.parse(f"/d={EXAMPLE}")])


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: Agent.load(5), "Agent.load"),  # type: ignore[arg-type]
        (lambda: Registry.for_agent(str(EXAMPLE)), "agent"),  # type: ignore[arg-type]
        (lambda: Registry(agent="field-guide"), "agent"),  # type: ignore[arg-type]
        (lambda: Registry("abc"), "tools"),  # type: ignore[arg-type]
        (lambda: Registry().add("echo"), "ToolSpec"),  # type: ignore[arg-type]
        (lambda: ToolSpec.command_tool("t", "Lists.", "ls -l"), "command"),
        (lambda: ToolSpec.command_tool("t", None, ["ls"]), "description"),  # type: ignore[arg-type]
        (lambda: ToolSpec.command_tool("t", "Lists.", ["ls"], timeout_seconds="5"), "timeout"),  # type: ignore[arg-type]
        (lambda: ToolSpec.command_tool("t", "Lists.", ["ls"], timeout_seconds=-1), "timeout"),
        (lambda: ToolSpec.command_tool("t", "Lists.", ["ls"], parameters="x"), "parameters"),  # type: ignore[arg-type]
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_what_builds_an_executors_registry_refuses_wrong_values(
    build: Callable[[], object], named: str
) -> None:
    """Agent, Registry and ToolSpec raise one UsageError naming the value, not an
    AttributeError from inside (or, for a command as one string, a tool of one letter each)."""
    with pytest.raises(UsageError, match=named):
        build()


def test_a_provider_with_only_a_name_and_search_is_still_a_searcher() -> None:
    """A sync-only provider (no asearch) serves sync calls, as before the checks."""

    class SyncOnly:
        name = "sync-only"

        def search(self, query: str, max_results: int) -> list[object]:
            return []

    registry = Registry.for_agent(Agent.load(EXAMPLE))
    assert Executor(registry, sandbox=FakeSandbox(), searcher=SyncOnly()).searcher is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ("wiki.test=10.0.0.5", "network_hosts maps host names to addresses"),
        (
            {"other.test": "10.0.0.5"},
            "'other.test' is not on the network allow-list (wiki.test:8080)",
        ),
        ({"wiki.test": "wiki.lan"}, "'wiki.test' maps to 'wiki.lan', which is not an IP address"),
        ({"wiki.test": []}, "'wiki.test' maps to [], not an IP address"),
        ({"": "10.0.0.5"}, "'' is not a host name"),
    ],
)
def test_network_hosts_are_checked_against_the_allow_list(hosts: object, expected: str) -> None:
    """A pinned name must be listed and map to IP addresses; anything else names the mistake."""
    with pytest.raises(UsageError, match="network_hosts") as info:
        Executor(
            Registry(),
            sandbox=FakeSandbox(),
            network_allow=["wiki.test:8080"],
            network_hosts=hosts,  # type: ignore[arg-type]
        )
    assert expected in str(info.value)


def test_network_hosts_pin_names_and_admit_their_addresses_on_their_ports() -> None:
    """The executor's fetcher answers a pinned name with its address and admits it on the
    listed ports only (every spelling of the name alike)."""
    executor = Executor(
        Registry(),
        sandbox=FakeSandbox(),
        network_allow=["Wiki.test:8080", "*.lan.test"],
        network_hosts={"WIKI.test.": "10.0.0.5", "db.lan.test": ["10.0.0.6", "fd00::6"]},
    )
    resolver = executor.fetcher.resolver
    assert resolver.resolve("wiki.test", 8080) == ("10.0.0.5",)
    assert resolver.resolve("db.lan.test", 443) == ("10.0.0.6", "fd00::6")
    rules = {(str(r.network), tuple(sorted(r.ports))) for r in executor.fetcher.policy.allow}
    assert rules == {
        ("10.0.0.5/32", (8080,)),
        ("10.0.0.6/32", (80, 443)),
        ("fd00::6/128", (80, 443)),
    }
