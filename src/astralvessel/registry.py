"""Registry: the tools one agent may call, and their schemas for each model API."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ._ground._suggest import unknown_name
from ._tools._dialects import DIALECTS, Dialect, render_schema
from ._tools._pytools import python_tool
from .builtins import BUILTINS
from .errors import ToolRegistrationError, UsageError
from .spec import ALL_SCOPES, BUILTIN_NAMES, Scope, ToolKind, ToolSpec, check_name

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Dialect", "Registry"]

_F = TypeVar("_F", bound=Callable[..., Any])


def builtin_spec(name: str) -> ToolSpec:
    """The ``ToolSpec`` of one built-in tool."""
    try:
        builtin = BUILTINS[name]
    except KeyError:
        raise ToolRegistrationError(
            f"{name!r} is not a built-in tool; built-ins are {', '.join(BUILTIN_NAMES)}"
        ) from None
    return ToolSpec(
        name=builtin.name,
        description=builtin.description,
        kind=ToolKind.BUILTIN,
        parameters=builtin.parameters,
        scope=builtin.scope,
    )


class Registry:
    """An ordered set of tools by name. Built-ins come first, then declared, then host tools.

    A registry built with ``for_agent`` remembers its agent, whose settings (workdir,
    timeouts, output cap, limits) the executor uses.
    """

    def __init__(self, tools: Iterable[ToolSpec] = (), *, agent: Agent | None = None) -> None:
        """Raises ``UsageError`` when ``tools`` is not a list of ``ToolSpec`` or ``agent``
        not an ``Agent``, and ``ToolRegistrationError`` as ``add`` does."""
        self.agent = None if agent is None else _agent(agent)
        self._tools: dict[str, ToolSpec] = {}
        if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
            raise UsageError(f"tools is a list of ToolSpec, not {tools!r}")
        for spec in tools:
            self.add(spec)

    @classmethod
    def for_agent(cls, agent: Agent) -> Registry:
        """The built-ins listed under ``[tools] builtin`` and the agent's declared tools.

        Raises ``UsageError`` when ``agent`` is not an ``Agent`` (``Agent.load(folder)``).
        """
        agent = _agent(agent)
        return cls([*(builtin_spec(n) for n in agent.builtin), *agent.tools], agent=agent)

    def add(self, spec: ToolSpec) -> None:
        """Add a tool; raise ``ToolRegistrationError`` if its name is taken or malformed,
        ``UsageError`` if it is not a ``ToolSpec``."""
        if not isinstance(spec, ToolSpec):
            raise UsageError(
                f"a registry holds ToolSpec values (ToolSpec.command_tool(...)), not {spec!r}"
            )
        problem = check_name(spec.name)
        if problem:
            raise ToolRegistrationError(problem)
        if spec.name in self._tools:
            raise ToolRegistrationError(f"a tool named {spec.name!r} is already registered")
        if spec.kind is not ToolKind.BUILTIN and spec.name in BUILTIN_NAMES:
            raise ToolRegistrationError(f"{spec.name!r} is a built-in tool's name; choose another")
        if spec.kind is ToolKind.BUILTIN and spec.name not in BUILTINS:
            raise ToolRegistrationError(f"{spec.name!r} is not a built-in tool")
        if spec.kind is ToolKind.PYTHON and spec.handler is None:
            raise ToolRegistrationError(
                f"Python tool {spec.name!r} has no function; register it with @registry.tool"
            )
        self._tools[spec.name] = spec

    @overload
    def tool(self, func: _F, /) -> _F: ...
    @overload
    def tool(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        scope: Scope | str = Scope.READ,
        timeout_seconds: float | None = None,
    ) -> Callable[[_F], _F]: ...
    def tool(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        scope: Scope | str = Scope.READ,
        timeout_seconds: float | None = None,
    ) -> Any:
        """Register a typed function as a tool: ``@registry.tool`` or ``@registry.tool(...)``.

        The parameters schema comes from the signature and the description and
        parameter notes from the docstring (see the Python tools docs). The
        function runs in the host process, not in a sandbox. Raise
        ``ToolError`` in it to report a failure to the model. Returns the
        function unchanged; raises ``ToolRegistrationError`` if no schema can be
        derived or the name is taken.
        """

        def register(target: _F) -> _F:
            self.add(
                python_tool(
                    target,
                    name=name,
                    description=description,
                    scope=scope,
                    timeout_seconds=timeout_seconds,
                )
            )
            return target

        return register if func is None else register(func)

    def add_builtin(self, name: str) -> None:
        """Add one of the built-in tools by name."""
        self.add(builtin_spec(name))

    def remove(self, name: str) -> ToolSpec:
        """Remove and return the tool called ``name``; raise KeyError if there is none."""
        return self._tools.pop(name)

    def get(self, name: str) -> ToolSpec | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"Registry({list(self._tools)!r})"

    def names(self, scopes: Iterable[Scope | str] | None = None) -> list[str]:
        """Tool names, in order, limited to ``scopes`` when given."""
        granted = _scopes(scopes)
        return [s.name for s in self._tools.values() if s.scope in granted]

    def schemas(
        self,
        dialect: Dialect = "openai",
        *,
        scopes: Iterable[Scope | str] | None = None,
        strict: bool = False,
    ) -> list[dict[str, Any]]:
        """Every tool in ``scopes`` (default: all) rendered for ``dialect``.

        ``"openai"`` gives Chat Completions function tools, ``"openai-responses"``
        the Responses API's flat function tools, ``"anthropic"`` Messages API tools
        with ``input_schema``, and ``"mcp"`` MCP ``Tool`` objects (with a title and
        behaviour hints for the built-ins). OpenAI tools always carry ``strict``:
        with ``strict=True`` it is true for every tool whose parameters already lie
        in OpenAI's strict subset (all properties required, no extra properties),
        false for the rest, whose schemas are never rewritten. Each call returns
        fresh dicts the caller may change.
        """
        if dialect not in DIALECTS:
            raise UsageError(unknown_name("dialect", str(dialect), DIALECTS))
        granted = _scopes(scopes)
        return [
            render_schema(spec, dialect, strict=strict)
            for spec in self._tools.values()
            if spec.scope in granted
        ]


def _scopes(scopes: Iterable[Scope | str] | None) -> frozenset[Scope]:
    if scopes is None:
        return ALL_SCOPES
    return frozenset(Scope.parse(str(s)) for s in scopes)


def _agent(agent: object) -> Agent:
    """``agent`` itself, or ``UsageError`` when it is not a loaded ``Agent``."""
    from .agent import Agent

    if not isinstance(agent, Agent):
        raise UsageError(f"agent is an Agent, loaded with Agent.load(folder), not {agent!r}")
    return agent
