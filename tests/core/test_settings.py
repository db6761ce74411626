"""ExecutorSettings and Limits: one checked value each, on every way of building one."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from astralvessel import Agent, ConfigError, Executor, Registry, UsageError
from astralvessel._executor._settings import ExecutorSettings, settings_from
from astralvessel.agent import TOOL_OUTPUT_CHARS, TOOL_TIMEOUT_SECONDS
from astralvessel.sandbox import Limits
from astralvessel.testing import FakeSandbox

from ..conftest import MakeAgent


@pytest.mark.parametrize(
    "wrong",
    [{"disk_mb": 0}, {"memory_mb": -1}, {"processes": True}, {"open_files": 5000}],
    ids=repr,
)
def test_limits_refuse_a_wrong_number_built_or_evolved(wrong: dict[str, object]) -> None:
    """Limits(...) and attrs.evolve run the same checks, each naming its limit."""
    (name,) = wrong
    with pytest.raises(UsageError, match=name):
        Limits(**wrong)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=name):
        attrs.evolve(Limits(), **wrong)


def test_a_limits_error_is_still_a_value_error() -> None:
    """Hosts that caught ValueError from Limits before still catch it."""
    with pytest.raises(ValueError, match="disk_mb"):
        Limits(disk_mb=0)


def test_vessel_toml_reports_every_wrong_limit_by_its_path(make_agent: MakeAgent) -> None:
    """Each wrong [limits] value is its own line, under its key, in one ConfigError."""
    folder = make_agent("[tools]\n[limits]\nmemory_mb = 0\nopen_files = 5000\nprocesses = 'x'\n")
    with pytest.raises(ConfigError) as raised:
        Agent.load(folder)
    problems = raised.value.problems
    assert {p.split(": ")[1] for p in problems} == {
        "limits.memory_mb",
        "limits.open_files",
        "limits.processes",
    }, problems


def test_vessel_toml_limits_become_the_policys_limits(make_agent: MakeAgent) -> None:
    """[limits] is structured into Limits itself: unset keys keep Limits' own defaults."""
    agent = Agent.load(make_agent("[tools]\n[limits]\ndisk_mb = 64\n"))
    assert agent.limits == attrs.evolve(Limits(), disk_mb=64)


@pytest.mark.parametrize(
    "change",
    [
        {"timeout_seconds": 0},
        {"output_chars": "5"},
        {"limits": {"disk_mb": 64}},
        {"mounts": "/data=somewhere"},
        {"relax": ["no-such-promise"]},
        {"warm": -1},
        {"snapshot_budget_mb": 0},
        {"writable_root": "yes"},
        {"network_hosts": {"wiki.test": "wiki.lan"}},
    ],
    ids=repr,
)
def test_evolve_cannot_skip_the_settings_checks(change: dict[str, object]) -> None:
    """attrs.evolve runs each field's check, as building the settings does."""
    (name,) = change
    # The message names the argument, or for relax the promise it does not know.
    with pytest.raises(UsageError, match=f"{name}|unknown promise"):
        attrs.evolve(ExecutorSettings(), **change)


def test_an_unknown_setting_is_named_with_its_closest_match() -> None:
    """A misspelt keyword is a UsageError suggesting the argument meant."""
    with pytest.raises(UsageError, match="did you mean 'timeout_seconds'"):
        settings_from({"timeout_second": 5}, "RayExecutor")


def test_without_an_agent_the_defaults_are_the_agents_defaults() -> None:
    """An executor without an agent gets the same defaults vessel.toml leaves."""
    executor = Executor(Registry(), sandbox=FakeSandbox())
    assert (executor.timeout_seconds, executor.output_chars) == (
        TOOL_TIMEOUT_SECONDS,
        TOOL_OUTPUT_CHARS,
    )
    assert executor.policy.limits == Limits()


def test_the_settings_rebuild_the_same_executor(tmp_path: Path) -> None:
    """Executor(**settings.arguments()) gives the same policy and values: the form Ray ships."""
    first = Executor(
        Registry(),
        sandbox=FakeSandbox(),
        mounts={"/data": tmp_path},
        limits=Limits(disk_mb=32),
        relax=["no-ipc"],
        timeout_seconds=5,
        network_allow=["wiki.test:8080"],
        network_hosts={"wiki.test": "10.0.0.5"},
    )
    again = Executor(Registry(), sandbox=FakeSandbox(), **first.settings.arguments())
    assert again.policy == first.policy
    assert again.settings == first.settings
    assert again.timeout_seconds == 5.0
