"""The pytest plugin: ``vessel_*`` fixtures, agent folders as test items, schema snapshots.

Registered through the ``pytest11`` entry point, so installing astralvessel is
enough; in a checkout where the package is not installed, load it with
``-p astralvessel.testing.pytest_plugin``.

Fixtures, each built from the one before and each overridable in a
``conftest.py``: ``vessel_sandbox`` (the backend: the best confined one here,
or ``--vessel-backend NAME``), ``vessel_agent`` (from the test's
``@pytest.mark.vessel_agent(folder_or_files, **executor_options)``),
``vessel_registry``, ``vessel_executor`` and ``vessel_turn`` (closed after
the test, also when it fails). ``vessel_schema_snapshot`` compares a
registry's schemas with a stored snapshot. With ``--vessel-check`` (or
``vessel_check = true``) every ``vessel.toml`` under the test paths becomes
test items: the folder loads, and its schemas pass each dialect's checks.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ..agent import Agent
from ..errors import ConfigError
from ..executor import Executor, Turn
from ..registry import Registry
from ..sandbox._base import Sandbox
from ._checks import DIALECTS, check_folder, schema_problems, snapshot_text

__all__ = [
    "SchemaSnapshot",
    "vessel_agent",
    "vessel_executor",
    "vessel_registry",
    "vessel_sandbox",
    "vessel_schema_snapshot",
    "vessel_turn",
]

_MARKER = "vessel_agent"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("astralvessel")
    group.addoption(
        "--vessel-backend",
        default=None,
        metavar="NAME",
        help="sandbox backend of the vessel_* fixtures (default: the best confined one here)",
    )
    group.addoption(
        "--vessel-check",
        action="store_true",
        default=None,
        help="collect every vessel.toml as tests: the folder loads, its schemas are valid",
    )
    group.addoption(
        "--vessel-update-snapshots",
        action="store_true",
        default=False,
        help="write the schema snapshots vessel_schema_snapshot compares with",
    )
    parser.addini("vessel_backend", "default of --vessel-backend", default="")
    parser.addini(
        "vessel_check", "collect vessel.toml folders as tests", type="bool", default=False
    )
    parser.addini(
        "vessel_dialects",
        "dialects whose schemas --vessel-check validates",
        type="args",
        default=list(DIALECTS),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(folder_or_files, **executor_options): the agent of the vessel_* fixtures: "
        "a folder (relative to the test file) or a dict of files written to tmp_path",
    )


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def vessel_sandbox(pytestconfig: pytest.Config) -> Sandbox:
    """The sandbox backend: ``--vessel-backend`` or the ini's, else the best confined one here.

    A backend that cannot run here fails the tests that use it, with its reason.
    """
    from ..sandbox import best_available, get_backend

    name = pytestconfig.getoption("vessel_backend") or pytestconfig.getini("vessel_backend")
    return get_backend(str(name)) if name else best_available()


def _marker(request: pytest.FixtureRequest) -> pytest.Mark:
    marker: pytest.Mark | None = request.node.get_closest_marker(_MARKER)
    if marker is None or len(marker.args) != 1:
        pytest.fail(
            f"mark the test with @pytest.mark.{_MARKER}(folder, **executor_options) or "
            f"@pytest.mark.{_MARKER}({{file: text}}), or override the vessel_agent fixture",
            pytrace=False,
        )
    return marker


def _write_files(folder: Path, files: Mapping[str, str | bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(textwrap.dedent(content))
    return folder


@pytest.fixture
def vessel_agent(request: pytest.FixtureRequest, tmp_path: Path) -> Agent:
    """The agent named by the test's ``vessel_agent`` marker: a folder, or files to write.

    A folder is relative to the test file; a dict maps paths to contents
    (``vessel.toml``, tool files, scripts), written to a fresh folder under
    ``tmp_path``. ``ConfigError`` fails the test with every problem.
    """
    source = _marker(request).args[0]
    if isinstance(source, Mapping):
        return Agent.load(_write_files(tmp_path / "agent", source))
    return Agent.load(request.path.parent / Path(source))


@pytest.fixture
def vessel_registry(vessel_agent: Agent) -> Registry:
    """The agent's registry; override it to add the host's Python tools."""
    return Registry.for_agent(vessel_agent)


def _options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker(_MARKER)
    options = dict(marker.kwargs) if marker is not None else {}
    mounts = options.get("mounts")
    if isinstance(mounts, Mapping):
        # Relative host folders are the test file's, as the agent folder is.
        base = request.path.parent
        options["mounts"] = {
            target: str(base / source) if not str(source).startswith("/") else str(source)
            for target, source in mounts.items()
        }
    return options


@pytest.fixture
def vessel_executor(
    request: pytest.FixtureRequest, vessel_registry: Registry, vessel_sandbox: Sandbox
) -> Iterator[Executor]:
    """An executor of the registry on ``vessel_sandbox``, with the marker's executor options."""
    executor = Executor(vessel_registry, sandbox=vessel_sandbox, **_options(request))
    try:
        yield executor
    finally:
        executor.close()


@pytest.fixture
def vessel_turn(vessel_executor: Executor) -> Iterator[Turn]:
    """One open turn of ``vessel_executor``; it ends after the test, pass or fail."""
    with vessel_executor.turn() as turn:
        yield turn


# -- schema snapshots -----------------------------------------------------------------------


class SchemaSnapshot:
    """Compares a registry's schemas in one dialect with ``__snapshots__/TEST.DIALECT.json``.

    ``--vessel-update-snapshots`` writes the files instead of comparing.
    """

    def __init__(self, folder: Path, name: str, *, update: bool) -> None:
        self.folder = folder
        self.name = name
        self.update = update

    def path(self, dialect: str, name: str | None = None) -> Path:
        """Where the snapshot of ``dialect`` is kept."""
        return self.folder / f"{name or self.name}.{dialect}.json"

    def __call__(
        self,
        registry: Registry,
        dialect: str = "openai",
        *,
        name: str | None = None,
        **schema_options: Any,
    ) -> None:
        """Assert the schemas equal the snapshot; a missing or stale one fails with a diff.

        ``name`` tells apart several snapshots of one dialect in one test (the
        test's name by default); ``schema_options`` go to ``Registry.schemas``.
        """
        text = snapshot_text(registry.schemas(dialect, **schema_options))  # type: ignore[arg-type]
        path = self.path(dialect, name)
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            raise AssertionError(
                f"no schema snapshot at {path}; write it with --vessel-update-snapshots"
            )
        stored = path.read_text()
        if stored != text:
            diff = "".join(
                difflib.unified_diff(
                    stored.splitlines(True), text.splitlines(True), str(path), "now"
                )
            )
            raise AssertionError(
                f"the {dialect} schemas changed (review, then --vessel-update-snapshots):\n{diff}"
            )


@pytest.fixture
def vessel_schema_snapshot(request: pytest.FixtureRequest) -> SchemaSnapshot:
    """``vessel_schema_snapshot(registry, "anthropic")`` asserts the schemas match the snapshot."""
    return SchemaSnapshot(
        request.path.parent / "__snapshots__",
        request.node.originalname,
        update=bool(request.config.getoption("vessel_update_snapshots")),
    )


# -- agent folders as tests -----------------------------------------------------------------


def _checking(config: pytest.Config) -> bool:
    option = config.getoption("vessel_check")
    return bool(option) if option is not None else bool(config.getini("vessel_check"))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name == "vessel.toml" and _checking(parent.config):
        return AgentFolder.from_parent(parent, path=file_path)
    return None


class AgentFolder(pytest.File):
    """One agent folder: an item that loads it, and one per dialect that checks its schemas."""

    def collect(self) -> Iterator[pytest.Item]:
        yield AgentCheck.from_parent(self, name="check", check=_load)
        for dialect in self.config.getini("vessel_dialects"):
            yield AgentCheck.from_parent(
                self, name=f"schemas[{dialect}]", check=_dialect_check(dialect)
            )


class AgentCheckError(AssertionError):
    """An agent folder's check found problems; the message lists them."""


def _load(folder: Path) -> None:
    try:
        check_folder(folder)
    except ConfigError as exc:
        raise AgentCheckError(str(exc)) from None


def _dialect_check(dialect: str) -> Callable[[Path], None]:
    def check(folder: Path) -> None:
        try:
            registry = check_folder(folder)
        except ConfigError as exc:
            raise AgentCheckError(
                f"the folder does not load, so no schema is checked:\n{exc}"
            ) from None
        problems = schema_problems(registry, dialect)
        if problems:
            raise AgentCheckError("\n".join(problems))

    return check


class AgentCheck(pytest.Item):
    """One check of an agent folder."""

    def __init__(self, *, check: Callable[[Path], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    def runtest(self) -> None:
        self.check(self.path.parent)

    def repr_failure(
        self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None
    ) -> str | Any:
        if isinstance(excinfo.value, AgentCheckError):
            return f"{self.path.parent}:\n{excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.parent.name}::{self.name}"
