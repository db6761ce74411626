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

import importlib
import logging
from typing import TYPE_CHECKING

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
from .errors import SnapshotError as SnapshotError
from .errors import ToolError as ToolError
from .errors import ToolRegistrationError as ToolRegistrationError
from .errors import TransportError as TransportError
from .errors import TurnClosedError as TurnClosedError
from .errors import UsageError as UsageError

# Silent until the host configures logging: every logger of the library is under this one.
logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:
    __version__: str

    from ._executor._exec import Listing as Listing
    from ._executor._snapshot._value import TurnSnapshot as TurnSnapshot
    from ._ground._ledger import Ledger as Ledger
    from ._ground._outcome import Outcome as Outcome
    from .agent import Agent as Agent
    from .agent import Service as Service
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

#: Where each public class lives, imported on its first use: ``import astralvessel`` (and
#: so every CLI start) no longer pays for the sandbox, web, asyncio and JSON Schema stacks
#: before something asks for them (0.5 s of CPU, 1.5 s at a loaded host's wall clock).
_HOMES: dict[str, str] = {
    "Listing": "._executor._exec",
    "Ledger": "._ground._ledger",
    "Outcome": "._ground._outcome",
    "Agent": ".agent",
    "Service": ".agent",
    "Executor": ".executor",
    "Turn": ".executor",
    "TurnSnapshot": "._executor._snapshot._value",
    "Registry": ".registry",
    "OutboxFile": ".results",
    "ToolResult": ".results",
    "DetachedProcess": ".sandbox._api",
    "ExecResult": ".sandbox._api",
    "InputMode": ".spec",
    "Scope": ".spec",
    "ToolKind": ".spec",
    "ToolSpec": ".spec",
}

#: Submodules the package used to import eagerly, so ``astralvessel.sandbox`` and the like
#: still resolve after a bare ``import astralvessel``.
_SUBMODULES = frozenset(
    {"agent", "builtins", "executor", "registry", "results", "sandbox", "spec", "web"}
)


def __getattr__(name: str) -> object:
    """Import a public name (or an eagerly-known submodule) on first use; cache it.

    Raises ``AttributeError`` for a name the package does not have.
    """
    if name == "__version__":
        value: object = _version()
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    # importlib.metadata costs 0.1-0.2 s to import (email parsing): only for who asks.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("astralvessel")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0.0.0"


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
    "Ledger",
    "Listing",
    "OutboxFile",
    "Outcome",
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
    "SnapshotError",
    "ToolError",
    "ToolKind",
    "ToolRegistrationError",
    "ToolResult",
    "ToolSpec",
    "TransportError",
    "Turn",
    "TurnClosedError",
    "TurnSnapshot",
    "UsageError",
    "__version__",
]
