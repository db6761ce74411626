"""astralvessel: run an LLM agent's tool calls in a real sandbox.

A host loads an agent folder, hands the registry's schemas to its model, and
passes every call the model makes to an executor's turn::

    agent = Agent.load("examples/field-guide")
    registry = Registry.for_agent(agent)
    executor = Executor(registry, mounts={"/data": "examples/sample-data"})
    with executor.turn() as turn:
        result = turn.call("species", '{"habitat": "rivers"}')
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._exec import Listing as Listing
from .agent import Agent as Agent
from .agent import Service as Service
from .errors import AstralVesselError as AstralVesselError
from .errors import BackendUnavailableError as BackendUnavailableError
from .errors import ConfigError as ConfigError
from .errors import EgressError as EgressError
from .errors import FileTooLargeError as FileTooLargeError
from .errors import PromiseNotEnforcedError as PromiseNotEnforcedError
from .errors import SandboxError as SandboxError
from .errors import SandboxFileError as SandboxFileError
from .errors import SandboxFileNotFoundError as SandboxFileNotFoundError
from .errors import SandboxIsADirectoryError as SandboxIsADirectoryError
from .errors import SandboxNotADirectoryError as SandboxNotADirectoryError
from .errors import SandboxPermissionError as SandboxPermissionError
from .errors import SearchError as SearchError
from .errors import ToolError as ToolError
from .errors import ToolRegistrationError as ToolRegistrationError
from .errors import TransportError as TransportError
from .errors import TurnClosedError as TurnClosedError
from .errors import UsageError as UsageError
from .executor import Executor as Executor
from .executor import Turn as Turn
from .registry import Registry as Registry
from .results import OutboxFile as OutboxFile
from .results import ToolResult as ToolResult
from .sandbox._api import DetachedProcess as DetachedProcess
from .sandbox._api import ExecResult as ExecResult
from .spec import InputMode as InputMode
from .spec import Scope as Scope
from .spec import ToolKind as ToolKind
from .spec import ToolSpec as ToolSpec

try:
    __version__ = version("astralvessel")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0.0.0"

__all__ = [
    "Agent",
    "AstralVesselError",
    "BackendUnavailableError",
    "ConfigError",
    "DetachedProcess",
    "EgressError",
    "ExecResult",
    "Executor",
    "FileTooLargeError",
    "InputMode",
    "Listing",
    "OutboxFile",
    "PromiseNotEnforcedError",
    "Registry",
    "SandboxError",
    "SandboxFileError",
    "SandboxFileNotFoundError",
    "SandboxIsADirectoryError",
    "SandboxNotADirectoryError",
    "SandboxPermissionError",
    "Scope",
    "SearchError",
    "Service",
    "ToolError",
    "ToolKind",
    "ToolRegistrationError",
    "ToolResult",
    "ToolSpec",
    "TransportError",
    "Turn",
    "TurnClosedError",
    "UsageError",
    "__version__",
]
