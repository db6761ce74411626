"""Checking a model's arguments before anything runs, and rendering them for a command.

Pure functions: each refusal is a message the model can act on, returned as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from .spec import InputMode, ToolSpec

__all__ = ["Refusal", "args_argv", "check_arguments", "parse_arguments", "unknown_tool"]


class Refusal(Exception):
    """Why a call was refused before it ran; ``str()`` is the text the model sees."""


_EXAMPLE = '{"name": "value"}'


def parse_arguments(tool: str, arguments: object) -> dict[str, Any]:
    """Turn a dict or the model's raw JSON text into a dict, or raise ``Refusal``."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, (str, bytes, bytearray)):
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
            raise Refusal(
                f"Error: the arguments for {tool} are not valid JSON ({detail}). "
                f"Call {tool} again with its arguments as one JSON object, such as {_EXAMPLE}."
            ) from None
    if not isinstance(arguments, Mapping):
        kind = _json_type(arguments)
        raise Refusal(
            f"Error: the arguments for {tool} must be a JSON object, not {kind}. "
            f"Call {tool} again with its arguments as one JSON object, such as {_EXAMPLE}."
        )
    if not all(isinstance(k, str) for k in arguments):
        raise Refusal(f"Error: the argument names for {tool} must be strings.")
    return dict(arguments)


def unknown_tool(name: object, available: Iterable[str]) -> str:
    """The message for a call to a tool that does not exist (or is not granted)."""
    names = ", ".join(available) or "none"
    return f"Error: there is no tool named {str(name)!r}. The tools you can call are: {names}."


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
    """Validate ``arguments`` against the tool's schema and input mode, or raise ``Refusal``."""
    validator = jsonschema.Draft202012Validator(dict(spec.parameters))
    error = best_match(validator.iter_errors(dict(arguments)))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        at = f" at {where!r}" if where else ""
        raise Refusal(
            f"Error: invalid arguments for {spec.name}{at}: {error.message}. "
            f"Call {spec.name} again with arguments that match its parameters schema."
        )
    if spec.input is InputMode.ARGS:
        declared = spec.property_names
        extra = [name for name in arguments if name not in declared]
        if extra:
            accepted = ", ".join(declared) or "no arguments"
            raise Refusal(
                f"Error: {spec.name} does not accept the argument {extra[0]!r}; "
                f"it accepts: {accepted}. Call {spec.name} again with only those."
            )


def args_argv(spec: ToolSpec, arguments: Mapping[str, Any]) -> list[str]:
    """The ``--name=value`` flags for ``input = "args"``, in the schema's declared order.

    Values use Python's ``str()`` exactly (``True``, ``['a', 'b']``); each flag is a
    single argv element, so no value can split into a flag of its own.
    """
    return [f"--{name}={arguments[name]}" for name in spec.property_names if name in arguments]


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return "a string"
