"""Checking a model's arguments before anything runs, and rendering them for a command.

Pure functions: each refusal is a message the model can act on, returned as text.

Every byte the model controls is bounded here, before it reaches a JSON parser, a
jsonschema validator, a frame to the sandbox server or an ``execve``:

- the arguments as JSON text: at most ``MAX_ARGUMENTS_BYTES`` (1 MiB);
- nesting: at most ``MAX_DEPTH`` (64) levels of objects and arrays;
- integers: at most ``MAX_INTEGER_DIGITS`` (1000) digits; numbers must be finite;
- text: valid Unicode (no lone surrogate, which no UTF-8 encoder accepts);
- tools whose arguments travel in an argv or a frame header (``input = "args"``
  and the built-ins): no NUL character (no argv element can hold one) and at most
  ``MAX_ARGV_BYTES`` (128 KiB, the kernel's limit for one argv string) of text.

See ``docs/concepts/calls-and-results.md``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from .._ground._suggest import closest
from ..errors import ConfigError
from ..spec import InputMode, ToolKind, ToolSpec

__all__ = [
    "MAX_ARGUMENTS_BYTES",
    "MAX_ARGV_BYTES",
    "MAX_DEPTH",
    "MAX_INTEGER_DIGITS",
    "Refusal",
    "args_argv",
    "check_arguments",
    "parse_arguments",
    "schema_problem",
    "unknown_tool",
]

#: The most UTF-8 bytes of arguments (as JSON text) a call may carry.
MAX_ARGUMENTS_BYTES = 1 << 20
#: The deepest nesting of objects and arrays in a call's arguments.
MAX_DEPTH = 64
#: The most digits of one integer argument (Python refuses to print more than 4300).
MAX_INTEGER_DIGITS = 1000
#: The most UTF-8 bytes of text in the arguments of a tool that takes them in its argv
#: (Linux's MAX_ARG_STRLEN, 128 KiB, is the most one argv string may hold anyway).
MAX_ARGV_BYTES = 128 * 1024

# 10**1000 has 3322 bits: checking the bit length costs nothing, counting digits does.
_MAX_INTEGER_BITS = math.ceil(MAX_INTEGER_DIGITS * math.log2(10))


class Refusal(Exception):
    """Why a call was refused before it ran; ``str()`` is the text the model sees."""


_EXAMPLE = '{"name": "value"}'


def parse_arguments(tool: str, arguments: object) -> dict[str, Any]:
    """Turn a dict or the model's raw JSON text into a dict, or raise ``Refusal``."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, (str, bytes, bytearray)):
        # A str's length in characters is at most its UTF-8 length in bytes.
        if len(arguments) > MAX_ARGUMENTS_BYTES:
            raise Refusal(_too_big(tool, len(arguments)))
        arguments = _loads(tool, arguments)
    if not isinstance(arguments, Mapping):
        kind = _json_type(arguments)
        raise Refusal(
            f"Error: the arguments for {tool} must be a JSON object, not {kind}. "
            f"Call {tool} again with its arguments as one JSON object, such as {_EXAMPLE}."
        )
    if not all(isinstance(k, str) for k in arguments):
        raise Refusal(f"Error: the argument names for {tool} must be strings.")
    return dict(arguments)


def _loads(tool: str, text: str | bytes | bytearray) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
    except RecursionError:
        detail = f"nested deeper than {MAX_DEPTH} levels"
    except ValueError:
        # Python refuses to convert an integer of more than 4300 digits.
        detail = f"a number has more than {MAX_INTEGER_DIGITS} digits"
    raise Refusal(
        f"Error: the arguments for {tool} are not valid JSON ({detail}). "
        f"Call {tool} again with its arguments as one JSON object, such as {_EXAMPLE}."
    )


#: The most characters of an unknown tool's name the refusal repeats back to the model.
MAX_SHOWN_NAME_CHARS = 100


def unknown_tool(name: object, available: Iterable[str]) -> str:
    """The message for a call to a tool that does not exist (or is not granted).

    A name of megabytes is cut: the model needs to see that it was wrong, not all of it.
    """
    available = list(available)
    names = ", ".join(available) or "none"
    text = str(name)
    if len(text) > MAX_SHOWN_NAME_CHARS:
        shown = f"{text[:MAX_SHOWN_NAME_CHARS]!r} (cut; {len(text)} characters in all)"
        near = []
    else:
        shown = repr(text)
        near = closest(text, available)
    # The closest names first: a model that misspelt a tool retries with the right one.
    hint = f" Did you mean {' or '.join(near)}?" if near else ""
    return f"Error: there is no tool named {shown}.{hint} The tools you can call are: {names}."


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
    """Check ``arguments`` against the bounds, the schema and input mode, or raise ``Refusal``.

    Raises ``ConfigError`` if the tool's own schema cannot be used (a ``$ref``
    that resolves nowhere): that is the host's mistake, not the model's.
    """
    in_argv = spec.input is InputMode.ARGS or spec.kind is ToolKind.BUILTIN
    _check_bounds(spec.name, arguments, in_argv=in_argv)
    # Keyed by the spec's own schema text: no parse and re-dump of the schema per call.
    validator = _validator(spec.schema_json)
    try:
        error = best_match(validator.iter_errors(dict(arguments)))
    except jsonschema.exceptions.SchemaError as exc:  # pragma: no cover - check_schema ran
        raise ConfigError([f"tool {spec.name}: parameters: {exc.message}"]) from None
    except Exception as exc:
        # A dangling $ref surfaces only while validating (referencing's Unresolvable).
        raise ConfigError([f"tool {spec.name}: parameters: {_schema_failure(exc)}"]) from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        at = f" at {where!r}" if where else ""
        raise Refusal(
            f"Error: invalid arguments for {spec.name}{at}: {_short(error.message)}. "
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
        argv_bytes = sum(len(flag.encode("utf-8")) for flag in args_argv(spec, arguments))
        if argv_bytes > MAX_ARGV_BYTES:
            raise Refusal(_argv_too_big(spec.name, argv_bytes))


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a parameters schema cannot validate arguments (a dangling ``$ref``), or None.

    Resolves every ``$ref`` in the schema once, so ``check`` finds what would
    otherwise fail on every call.
    """
    try:
        validator = _validator(_canonical(schema))
        # referencing's resolver for this schema (jsonschema has no public name for it)
        resolver = getattr(validator, "_resolver")  # noqa: B009
        for ref in _refs(schema):
            resolver.lookup(ref)
    except Exception as exc:
        return _schema_failure(exc)
    return None


def _refs(schema: object) -> list[str]:
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _schema_failure(exc: BaseException) -> str:
    return f"cannot be used to check arguments ({type(exc).__name__}: {_short(str(exc))})"


def _canonical(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    """One validator per distinct schema: building one costs far more than a call's check."""
    return jsonschema.Draft202012Validator(json.loads(schema_json))


def args_argv(spec: ToolSpec, arguments: Mapping[str, Any]) -> list[str]:
    """The ``--name=value`` flags for ``input = "args"``, in the schema's declared order.

    Values use Python's ``str()`` exactly (``True``, ``['a', 'b']``); each flag is a
    single argv element, so no value can split into a flag of its own.
    """
    return [f"--{name}={arguments[name]}" for name in spec.property_names if name in arguments]


def _check_bounds(tool: str, arguments: Mapping[str, Any], *, in_argv: bool) -> None:
    """Walk the arguments once, without recursion, refusing what no later step could carry."""
    text_bytes = 0
    stack: list[tuple[object, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            items: Iterable[object] = [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            items = value
        else:
            text_bytes += _check_scalar(tool, value, in_argv=in_argv)
            if text_bytes > MAX_ARGUMENTS_BYTES or (in_argv and text_bytes > MAX_ARGV_BYTES):
                break
            continue
        if depth > MAX_DEPTH:
            raise Refusal(
                f"Error: the arguments for {tool} are nested deeper than {MAX_DEPTH} levels. "
                f"Call {tool} again with flatter arguments."
            )
        stack.extend((item, depth + 1) for item in items)
    if in_argv and text_bytes > MAX_ARGV_BYTES:
        raise Refusal(_argv_too_big(tool, text_bytes))
    size = text_bytes if text_bytes > MAX_ARGUMENTS_BYTES else _json_size(arguments)
    if size > MAX_ARGUMENTS_BYTES:
        raise Refusal(_too_big(tool, size))


def _check_scalar(tool: str, value: object, *, in_argv: bool) -> int:
    """Refuse a scalar nothing downstream can carry; return its UTF-8 size if it is text."""
    if isinstance(value, str):
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise Refusal(
                f"Error: the arguments for {tool} hold text that is not valid Unicode "
                "(a lone surrogate). Call it again with plain text."
            ) from None
        if in_argv and "\0" in value:
            raise Refusal(
                f"Error: the arguments for {tool} hold a NUL character, which a command "
                f"line cannot carry. Call {tool} again without it."
            )
        return size
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int) and value.bit_length() > _MAX_INTEGER_BITS:
        raise Refusal(
            f"Error: a number in the arguments for {tool} has more than "
            f"{MAX_INTEGER_DIGITS} digits. Call {tool} again with a smaller number, "
            "or pass it as a string."
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise Refusal(
            f"Error: the arguments for {tool} hold {value!r}, which is not a JSON number. "
            f"Call {tool} again with finite numbers."
        )
    return 0


def _json_size(arguments: Mapping[str, Any]) -> int:
    try:
        return len(json.dumps(arguments, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError):
        return 0  # not JSON at all: the schema check says what is wrong


def _too_big(tool: str, size: int) -> str:
    return (
        f"Error: the arguments for {tool} are {size} bytes; at most {MAX_ARGUMENTS_BYTES} "
        f"are accepted. Call {tool} again with less data (write large content to a file "
        "in several smaller calls)."
    )


def _argv_too_big(tool: str, size: int) -> str:
    return (
        f"Error: the arguments for {tool} hold {size} bytes of text; a command line takes at "
        f"most {MAX_ARGV_BYTES}. Call {tool} again with less text (write large content to a "
        "file in several smaller calls)."
    )


def _short(text: str, limit: int = 300) -> str:
    """A validator's message quotes the value: never echo a megabyte back to the model."""
    return text if len(text) <= limit else text[:limit] + "..."


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    # A value the host passed as it came (a tuple, a set, a model object): name its type
    # rather than call it a string.
    return f"a {type(value).__name__}, which is not JSON"
