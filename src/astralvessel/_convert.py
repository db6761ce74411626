"""The private cattrs converter that turns parsed TOML into typed values.

It is strict on purpose: TOML already has types, so a string where a number
belongs is the author's mistake, not something to coerce, and an unknown key is
usually a typo that must not be silently ignored. Its errors become readable
``file: key.path: what is wrong`` lines.
"""

from __future__ import annotations

from typing import Any, get_origin

import cattrs
from cattrs.cols import list_structure_factory
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

__all__ = ["converter", "describe_errors"]


def _strict(kind: type, label: str) -> Any:
    def hook(value: object, _: object) -> object:
        if isinstance(value, bool) and kind is not bool:
            raise TypeError(f"expected {label}, got a boolean")
        if kind is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, kind):
            raise TypeError(f"expected {label}, got {_toml_type(value)}")
        return value

    return hook


def _toml_type(value: object) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }
    return names.get(type(value), type(value).__name__)


converter = cattrs.Converter(forbid_extra_keys=True)
converter.register_structure_hook(str, _strict(str, "a string"))
converter.register_structure_hook(int, _strict(int, "an integer"))
converter.register_structure_hook(float, _strict(float, "a number"))
converter.register_structure_hook(bool, _strict(bool, "a boolean"))


def _is_list(type_: Any) -> bool:
    return get_origin(type_) is list


def _strict_list(type_: Any, conv: cattrs.Converter) -> Any:
    # cattrs would happily iterate a string into a list of characters.
    inner = list_structure_factory(type_, conv)

    def hook(value: object, target: object) -> object:
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {_toml_type(value)}")
        return inner(value, target)

    return hook


converter.register_structure_hook_factory(_is_list, _strict_list)


def describe_errors(exc: BaseException, path: str = "") -> list[str]:
    """Flatten a cattrs error tree into ``key.path: message`` lines."""
    lines: list[str] = []
    if isinstance(exc, ForbiddenExtraKeysError):
        for key in sorted(exc.extra_fields):
            where = f"{path}.{key}" if path else key
            lines.append(f"{where}: unknown key (check the spelling)")
        return lines
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            if name is not None:
                where = f"{path}.{name}" if path else str(name)
            elif index is not None:
                where = f"{path}[{index}]"
            else:
                where = path
            if isinstance(sub, KeyError):
                lines.append(f"{where}: required key is missing")
            else:
                lines.extend(describe_errors(sub, where))
        for sub in without:
            lines.extend(describe_errors(sub, path))
        return lines
    message = str(exc) or type(exc).__name__
    return [f"{path}: {message}" if path else message]
