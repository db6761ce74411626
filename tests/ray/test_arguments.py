"""RayExecutor checks every argument on the host, before any Ray call, as Executor does.

Before, only a backend instance was refused here: every other wrong value travelled
to a node and failed at a turn's first call (a timeout of "5"), or never (a
misspelt keyword on a turn nobody called).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry, UsageError
from astralvessel.ray import RayExecutor
from astralvessel.ray import _executor as ray_executor
from astralvessel.sandbox import Bubblewrap, Limits
from astralvessel.testing import FakeSandbox

EXAMPLE = Path(__file__).parents[2] / "examples" / "field-guide"

#: Each wrong value, and a word its message must hold (the argument, or what of it is wrong).
WRONG: list[tuple[str, object, str]] = [
    ("registry", None, "Registry"),
    ("registry", str(EXAMPLE), "Registry"),
    ("sandbox", Bubblewrap(), "instance"),
    ("sandbox", 5, "sandbox"),
    ("mounts", "/data=somewhere", "mounts"),
    ("mounts", {"/data": None}, "host path"),
    ("mounts", {5: "."}, "sandbox path"),
    ("mounts", {"data": "."}, "sandbox path"),
    ("mounts", {"/usr/x": "."}, "reserved"),
    ("address", 5, "address"),
    ("actor_options", ["resources"], "actor_options"),
    ("scopes", "tools:read", "scopes"),
    ("limits", {"disk_mb": 64}, "limits"),
    ("relax", ["no-such-promise"], "promise"),
    ("timeout_seconds", "5", "timeout_seconds"),
    ("timeout_seconds", -1, "timeout_seconds"),
    ("output_chars", "5", "output_chars"),
    ("outbox_dir", 5, "outbox_dir"),
    ("services", ["lookup"], "services"),
    ("fetcher", 5, "fetcher"),
    ("searcher", "duckduckgo", "searcher"),
    ("writable_root", "yes", "writable_root"),
    ("warm", -1, "warm"),
    ("snapshot", "saved.tar", "snapshot"),
    ("snapshot_budget_mb", 0, "snapshot_budget_mb"),
    ("network_hosts", {"other.test": "10.0.0.5"}, "allow-list"),
    ("timeout_second", 5, "did you mean 'timeout_seconds'"),
]


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Ray call fails the test: every check must come before the first."""

    def called() -> object:
        raise AssertionError("RayExecutor reached Ray before refusing its argument")

    monkeypatch.setattr(ray_executor, "_ray", called)


@pytest.mark.parametrize(("argument", "value", "named"), WRONG, ids=repr)
@pytest.mark.usefixtures("no_ray")
def test_a_wrong_argument_is_refused_on_the_host(argument: str, value: object, named: str) -> None:
    """Each wrong value raises one UsageError naming it, with no cluster and no Ray call."""
    given: dict[str, object] = {
        "registry": Registry.for_agent(Agent.load(EXAMPLE)),
        "sandbox": "bubblewrap",
        "network_allow": ["wiki.test:8080"],
        argument: value,
    }
    with pytest.raises(UsageError, match=named):
        RayExecutor(**given)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value", "named"),
    [w for w in WRONG if w[0] not in {"sandbox", "mounts", "address", "actor_options"}],
    ids=repr,
)
def test_executor_refuses_the_same_values_with_the_same_words(
    argument: str, value: object, named: str
) -> None:
    """The keywords both executors share are one check: Executor's message is the same."""
    given: dict[str, object] = {
        "registry": Registry.for_agent(Agent.load(EXAMPLE)),
        "sandbox": FakeSandbox(),
        "network_allow": ["wiki.test:8080"],
        argument: value,
    }
    error = TypeError if argument == "timeout_second" else UsageError
    with pytest.raises(error, match=named if error is UsageError else argument):
        Executor(**given)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_ray")
def test_right_values_get_as_far_as_ray() -> None:
    """Well-formed arguments pass every check: the first thing refused is the Ray call."""
    with pytest.raises(AssertionError, match="reached Ray"):
        RayExecutor(
            Registry.for_agent(Agent.load(EXAMPLE)),
            sandbox=Bubblewrap,
            mounts={"/data": "/only/on/the/nodes"},
            limits=Limits(disk_mb=64),
            timeout_seconds=5,
            warm=1,
        )
