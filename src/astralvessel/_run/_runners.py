"""Which runner plans a call: one row per tool kind, and a built-in's own row says how it runs.

A new tool kind is one row here and one small planner; a new built-in is one
row in ``builtins.BUILTINS``. Nothing else chooses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .._calls._plans import Call, Plan, SandboxRun, TurnContext
from .._ground._kinds import InputMode, ToolKind
from .._tools._arguments import args_argv
from ..builtins import BUILTINS
from ..results import ToolResult
from ..sandbox._base import RunRequest
from ..sandbox._policy import AGENT_DIR
from ..spec import ToolSpec
from ._hosttools import plan_python, plan_service

__all__ = ["RUNNERS", "plan_call"]

Runner = Callable[[TurnContext, ToolSpec, Call], "Plan[Any] | ToolResult"]


def _plan_command(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any]:
    """A declared command: its argv with ``{package}`` filled in, the arguments as it asks."""
    argv = [part.replace("{package}", str(AGENT_DIR)) for part in spec.command or ()]
    if spec.input is InputMode.ARGS:
        argv += args_argv(spec, call.arguments)
        stdin = b""
    else:
        stdin = json.dumps(dict(call.arguments), ensure_ascii=False).encode("utf-8")
    return SandboxRun(
        request=RunRequest(
            argv=tuple(argv),
            stdin=stdin,
            timeout=call.timeout,
            output_chars=context.output_chars,
        )
    )


def _plan_builtin(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any] | ToolResult:
    return BUILTINS[spec.name].plan(context, call)


#: The runner of each tool kind.
RUNNERS: Mapping[ToolKind, Runner] = MappingProxyType(
    {
        ToolKind.COMMAND: _plan_command,
        ToolKind.BUILTIN: _plan_builtin,
        ToolKind.PYTHON: plan_python,
        ToolKind.SERVICE: plan_service,
    }
)


def plan_call(context: TurnContext, spec: ToolSpec, call: Call) -> Plan[Any] | ToolResult:
    """The plan for one checked call, or its result when nothing needs to run."""
    return RUNNERS[spec.kind](context, spec, call)
