"""Agent: a loaded agent folder, ``vessel.toml`` plus its declared tool files."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from ._ground._convert import Structured, structure_leniently
from ._ground._netallow import HostPattern, parse_allow_list, read_allow_list
from ._ground._suggest import unknown_name
from ._tools._arguments import schema_problem
from .errors import ConfigError, UsageError
from .sandbox._policy import AGENT_DIR, SYSTEM_DIRS, WORKSPACE_DIR, Limits, Relaxations
from .spec import BUILTIN_NAMES, Scope, ToolSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["Agent", "Service"]

VESSEL_FILE = "vessel.toml"
#: The largest vessel.toml or tool file read: a config file is a few kilobytes, and a
#: huge one would cost the TOML parser seconds and hundreds of megabytes to refuse.
MAX_CONFIG_BYTES = 1 << 20
#: A tool call's time limit and the characters of its output the model reads, when
#: vessel.toml names none (``tool_timeout_seconds``, ``tool_output_chars``), and for an
#: executor without an agent.
TOOL_TIMEOUT_SECONDS = 30.0
TOOL_OUTPUT_CHARS = 30_000


@attrs.frozen(kw_only=True)
class Service:
    """A ``[services.NAME]`` entry: where service tools naming it are posted."""

    name: str
    url: str


@attrs.frozen(kw_only=True)
class Agent(Relaxations):
    """A validated agent folder. Build it with ``Agent.load``.

    Its ``writable_root``, ``root_identity`` and ``tool_servers`` are ``[sandbox]``'s eval
    relaxations, a ``Relaxations`` as a ``Policy``'s are (one set of rules; ``relaxations``
    gives them as a plain value); the host's ``Executor`` arguments override them.
    """

    path: Path
    name: str
    workdir: PurePosixPath = WORKSPACE_DIR
    tool_timeout_seconds: float = TOOL_TIMEOUT_SECONDS
    tool_output_chars: int = TOOL_OUTPUT_CHARS
    #: The scopes vessel.toml says this agent may use; None when it does not say.
    scopes: frozenset[Scope] | None = None
    builtin: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    limits: Limits = attrs.field(factory=Limits)
    dockerfile: Path | None = None
    services: Mapping[str, Service] = attrs.field(factory=dict)
    #: ``[network] allow``: the hosts calls may reach through the egress proxy (none: no network).
    network_allow: tuple[HostPattern, ...] = attrs.field(default=(), converter=parse_allow_list)

    @classmethod
    def load(cls, path: str | Path) -> Agent:
        """Load and check an agent folder; raise one ``ConfigError`` listing every problem,
        ``UsageError`` when ``path`` is not a path."""
        if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
            raise UsageError(f"Agent.load takes the agent folder's path, not {path!r}")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ConfigError([f"{folder}: not a folder; an agent folder holds {VESSEL_FILE}"])
        folder = folder.resolve()
        vessel_path = folder / VESSEL_FILE
        data, problems = _read_toml(vessel_path, label=VESSEL_FILE)
        if data is None:
            raise ConfigError(problems)
        # Every type and value problem of every file in one pass: a refused value is left out
        # and the checks of the rest still run (see structure_leniently).
        structured = structure_leniently(data, _VesselFile)
        raw = structured.value
        problems = [f"{VESSEL_FILE}: {p}" for p in structured.problems]
        problems += [f"{VESSEL_FILE}: {p}" for p in _vessel_problems(raw, structured)]
        fine = structured.fine
        declared = [r for i, r in enumerate(raw.tools.declared) if fine("tools", "declared", i)]
        tools = _load_tools(folder, declared, set(raw.services), problems)
        dockerfile = None
        if raw.sandbox.dockerfile is not None:
            dockerfile, problem = _resolve_inside(folder, raw.sandbox.dockerfile)
            if problem:
                problems.append(f"{VESSEL_FILE}: sandbox.dockerfile: {problem}")
        # Each bad pattern where it stands, as every other list's entries are named.
        written = [
            (i, text) for i, text in enumerate(raw.network.allow) if fine("network", "allow", i)
        ]
        network_allow, allow_problems = read_allow_list(text for _, text in written)
        problems += [
            f"{VESSEL_FILE}: network.allow[{written[at][0]}]: {problem}"
            for at, problem in allow_problems
        ]
        if problems:
            raise ConfigError(problems)
        return cls(
            path=folder,
            name=raw.name or folder.name,
            workdir=PurePosixPath(raw.workdir),
            tool_timeout_seconds=raw.tool_timeout_seconds,
            tool_output_chars=raw.tool_output_chars,
            scopes=None if raw.scopes is None else frozenset(Scope(s) for s in raw.scopes),
            builtin=tuple(raw.tools.builtin),
            tools=tuple(tools),
            limits=raw.limits,
            dockerfile=dockerfile,
            services={n: Service(name=n, url=s.url) for n, s in raw.services.items()},
            network_allow=network_allow,
            **attrs.asdict(raw.sandbox.relaxations, recurse=False),
        )

    def package_path(self) -> PurePosixPath:
        """Where this agent folder appears inside the sandbox: what ``{package}`` becomes."""
        return AGENT_DIR


def _load_tools(
    folder: Path, declared: list[str], services: set[str], problems: list[str]
) -> list[ToolSpec]:
    """Read every declared tool file, appending each problem found to ``problems``."""
    tools: list[ToolSpec] = []
    seen: dict[str, str] = {}
    for index, rel in enumerate(declared):
        tool_path, problem = _resolve_inside(folder, rel)
        if tool_path is None:
            problems.append(f"{VESSEL_FILE}: tools.declared[{index}]: {problem}")
            continue
        data, file_problems = _read_toml(tool_path, label=rel)
        if data is None:
            problems.extend(file_problems)
            continue
        spec, spec_problems = ToolSpec.from_toml(data, source=tool_path)
        problems.extend(f"{rel}: {p}" for p in spec_problems)
        if spec is None:
            continue
        problem = schema_problem(spec.parameters)
        if problem is not None:
            problems.append(f"{rel}: parameters: {problem}")
        if spec.name in seen:
            problems.append(f"{rel}: name: {spec.name!r} is already declared in {seen[spec.name]}")
            continue
        seen[spec.name] = rel
        if spec.service is not None and spec.service not in services:
            known = ", ".join(sorted(services)) or "none are defined"
            problems.append(
                f"{rel}: service: {spec.service!r} names no [services.{spec.service}] "
                f"table in {VESSEL_FILE} ({known})"
            )
        tools.append(spec)
    return tools


_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def _read_toml(path: Path, *, label: str) -> tuple[dict[str, Any] | None, list[str]]:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return None, [f"{label}: larger than {MAX_CONFIG_BYTES} bytes; not a config file"]
        text = data.decode("utf-8")
    except FileNotFoundError:
        return None, [f"{label}: file not found (expected at {path.name} in the agent folder)"]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{label}: cannot be read: {exc}"]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.search(message)
        line = match.group(1) if match else str(text.count("\n") + 1)  # "at end of document"
        what = _TOML_POSITION.sub("", message).replace("(at end of document)", "").strip()
        return None, [f"{label}: line {line}: not valid TOML: {what}"]


def _resolve_inside(folder: Path, rel: str) -> tuple[Path | None, str | None]:
    """Resolve ``rel`` under ``folder``, refusing absolute paths and anything that leads outside."""
    if Path(rel).is_absolute():
        return None, f"{rel!r} must be a path relative to the agent folder"
    target = (folder / rel).resolve()
    if not target.is_relative_to(folder):
        return None, f"{rel!r} resolves outside the agent folder; tool files must live inside it"
    if not target.is_file():
        return None, f"{rel!r} does not exist in the agent folder"
    return target, None


@attrs.define
class _ToolsSection:
    builtin: list[str] = attrs.Factory(list)
    declared: list[str] = attrs.Factory(list)


@attrs.frozen(kw_only=True)
class _SandboxSection(Relaxations):
    """``[sandbox]``: the policy's own ``Relaxations`` (their validators are the file's rules),
    and the Dockerfile ``Agent.load`` resolves inside the folder."""

    dockerfile: str | None = None


@attrs.define
class _NetworkSection:
    allow: list[str] = attrs.Factory(list)


@attrs.define
class _ServiceSection:
    url: str


def _seconds(instance: object, attribute: object, value: float) -> None:
    if not value > 0:
        raise ValueError("must be a positive number of seconds")


def _characters(instance: object, attribute: object, value: int) -> None:
    if value < 1:
        raise ValueError("must be a positive number of characters")


@attrs.define
class _VesselFile:
    tools: _ToolsSection
    name: str | None = None
    workdir: str = str(WORKSPACE_DIR)
    tool_timeout_seconds: float = attrs.field(default=TOOL_TIMEOUT_SECONDS, validator=_seconds)
    tool_output_chars: int = attrs.field(default=TOOL_OUTPUT_CHARS, validator=_characters)
    scopes: list[str] | None = None
    # Structured straight into the sandbox's own value: its validators are the file's rules.
    limits: Limits = attrs.Factory(Limits)
    sandbox: _SandboxSection = attrs.Factory(_SandboxSection)
    services: dict[str, _ServiceSection] = attrs.Factory(dict)
    network: _NetworkSection = attrs.Factory(_NetworkSection)


def _vessel_problems(raw: _VesselFile, structured: Structured[_VesselFile]) -> list[str]:
    """Every value rule of vessel.toml, on the keys whose type was right (``structured.fine``)."""
    problems: list[str] = []
    builtin = [n for i, n in enumerate(raw.tools.builtin) if structured.fine("tools", "builtin", i)]
    for name in builtin:
        if name not in BUILTIN_NAMES:
            problems.append(f"tools.builtin: {unknown_name('built-in', name, BUILTIN_NAMES)}")
    if len(set(builtin)) != len(builtin):
        problems.append("tools.builtin: lists a built-in more than once")
    if structured.fine("workdir") and (problem := _workdir_problem(raw.workdir)):
        problems.append(f"workdir: {problem}")
    for index, scope in enumerate(raw.scopes or []):
        if structured.fine("scopes", index) and scope not in {s.value for s in Scope}:
            problems.append(f"scopes: {unknown_name('scope', scope, [s.value for s in Scope])}")
    for name, service in raw.services.items():
        if structured.fine("services", name, "url") and not re.match(r"^https?://", service.url):
            problems.append(
                f"services.{name}.url: {service.url!r} must be an http:// or https:// URL"
            )
    return problems


def _workdir_problem(text: str) -> str | None:
    """Why ``text`` cannot be the agent's workdir, or None when it can."""
    workdir = PurePosixPath(text)
    if not workdir.is_absolute() or ".." in workdir.parts:
        return f"{text!r} must be an absolute sandbox path such as /data"
    if workdir == PurePosixPath("/") or any(
        workdir == d or d in workdir.parents for d in SYSTEM_DIRS
    ):
        return f"{text!r} is a system directory; use a path such as /data"
    if workdir == AGENT_DIR or AGENT_DIR in workdir.parents:
        return f"{text!r} is inside /agent; use a path such as /data"
    return None
