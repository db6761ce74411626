"""The pytest plugin, run as a user's suite would run it: in a pytest process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

GOOD_AGENT = {
    "vessel.toml": '[tools]\nbuiltin = ["read"]\ndeclared = ["t.toml"]\n',
    "t.toml": 'name = "hello"\ndescription = "Say hello."\ncommand = ["echo", "hello"]\n',
}

SUITE = """
import pytest

from astralvessel.testing import FakeSandbox

FAKE = FakeSandbox(tools={"hello": "hi"})
AGENT = {
    "vessel.toml": '[tools]\\ndeclared = ["t.toml"]\\n',
    "t.toml": 'name = "hello"\\ndescription = "d"\\ncommand = ["echo", "hello"]\\n',
}
pytestmark = pytest.mark.vessel_agent(AGENT)


@pytest.fixture(scope="session")
def vessel_sandbox():
    return FAKE


def test_fails_with_its_turn_open(vessel_turn):
    assert vessel_turn.call("hello").text == "hi"
    assert FAKE.open_sessions == 1
    raise AssertionError("deliberately")


def test_the_failed_tests_turn_was_closed():
    assert FAKE.open_sessions == 0


@pytest.mark.vessel_agent
def test_marker_without_an_agent(vessel_agent):
    pass


def test_snapshot(vessel_registry, vessel_schema_snapshot):
    vessel_schema_snapshot(vessel_registry, "anthropic")
"""


def write(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_suite(root: Path, *args: str) -> dict[str, str]:
    """Run pytest on ``root`` with the plugin; each test's node name to its outcome and message."""
    report = root / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "astralvessel.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *args,
        ],
        cwd=root,
        # Ours alone, named above: the other installed plugins' imports (hypothesis,
        # langsmith, anyio) took 14-20 s of each run at load 12, and none is under test.
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        check=False,
        # Only a guard against a hang.
        timeout=240,
    )
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):  # noqa: S314 - our own pytest's report
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = (
            "passed" if failure is None else f"failed: {failure.get('message')} {failure.text}"
        )
    return outcomes


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's project: a test module, a sound agent folder and a broken one."""
    root = tmp_path_factory.mktemp("project")
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_inner.py").write_text(textwrap.dedent(SUITE))
    (root / "test_backend.py").write_text("def test_named_backend(vessel_sandbox):\n    pass\n")
    write(root / "good", GOOD_AGENT)
    write(root / "broken", {"vessel.toml": '[tools]\nbuiltin = ["read"]\ncolour = "red"\n'})
    return root


@pytest.fixture(scope="module")
def outcomes(suite: Path) -> dict[str, str]:
    """The outcomes of one run of the project with --vessel-check and a backend that is not there."""
    return run_suite(suite, "--vessel-check", "--vessel-backend", "nosuch")


def test_turn_closes_after_a_failing_test(outcomes: dict[str, str]) -> None:
    """vessel_turn ends when its test fails: the next test sees no fake turn open."""
    assert outcomes["test_inner::test_fails_with_its_turn_open"].startswith("failed")
    assert outcomes["test_inner::test_the_failed_tests_turn_was_closed"] == "passed"


def test_a_backend_that_cannot_run_fails_the_tests_using_it(outcomes: dict[str, str]) -> None:
    """--vessel-backend names the backend; one that is not there fails its tests, never skips them."""
    outcome = outcomes["test_backend::test_named_backend"]
    assert outcome.startswith("failed")
    assert "unknown backend 'nosuch'" in outcome


def test_a_marker_without_an_agent_fails_with_the_fix(outcomes: dict[str, str]) -> None:
    """A vessel_agent marker without its agent fails the test, saying how to mark it."""
    assert (
        "mark the test with @pytest.mark.vessel_agent"
        in outcomes["test_inner::test_marker_without_an_agent"]
    )


def test_a_missing_snapshot_fails_until_written(suite: Path, outcomes: dict[str, str]) -> None:
    """A missing snapshot fails; --vessel-update-snapshots writes it; a changed one fails with a diff."""
    assert "--vessel-update-snapshots" in outcomes["test_inner::test_snapshot"]
    run_suite(suite, "--vessel-update-snapshots", "-k", "snapshot")
    stored = suite / "__snapshots__" / "test_snapshot.anthropic.json"
    assert '"input_schema"' in stored.read_text()
    # Without --vessel-check, no vessel.toml is collected: a project's fixtures stay fixtures.
    assert run_suite(suite, "-k", "snapshot or closed") == {
        "test_inner::test_snapshot": "passed",
        "test_inner::test_the_failed_tests_turn_was_closed": "passed",
    }
    stored.write_text(stored.read_text().replace("hello", "goodbye"))
    changed = run_suite(suite, "-k", "snapshot")["test_inner::test_snapshot"]
    assert "the anthropic schemas changed" in changed
    assert '+    "name": "hello"' in changed


def test_sound_agent_folder_passes_every_check(outcomes: dict[str, str]) -> None:
    """A sound folder yields a passing load check and one passing schema check per dialect."""
    checks = {name: outcome for name, outcome in outcomes.items() if name.startswith("good.")}
    assert sorted(name.split("::")[1] for name in checks) == [
        "check",
        "schemas[anthropic]",
        "schemas[mcp]",
        "schemas[openai-responses]",
        "schemas[openai]",
    ]
    assert set(checks.values()) == {"passed"}


def test_broken_agent_folder_fails_naming_the_problem(outcomes: dict[str, str]) -> None:
    """A folder that does not load fails its check with the problem, and each schema check too."""
    checks = {name: outcome for name, outcome in outcomes.items() if name.startswith("broken.")}
    assert "colour" in checks["broken.vessel.toml::check"]
    assert "does not load" in checks["broken.vessel.toml::schemas[openai]"]
