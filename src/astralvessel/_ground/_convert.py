"""The private cattrs converter that turns parsed TOML into typed values.

It is strict on purpose: TOML already has types, so a string where a number
belongs is the author's mistake, not something to coerce, and an unknown key is
usually a typo that must not be silently ignored. Its errors become readable
``file: key.path: what is wrong`` lines.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import list_structure_factory
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

__all__ = ["Structured", "converter", "describe_errors", "structure_leniently"]


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


def _has_validators(type_: Any) -> bool:
    return attrs.has(type_) and any(f.validator is not None for f in attrs.fields(type_))


def _field_checked(type_: Any, conv: cattrs.Converter) -> Any:
    """Structure a class whose fields have validators, naming each wrong field by its path.

    cattrs reports a validator's error as the whole class's, and attrs stops at the
    first: each validated field is structured and checked on its own first, so every
    wrong value of the table is reported at once, under its key. The validators are
    called without an instance, so they check their own field alone.
    """
    cls = attrs.resolve_types(type_)
    build = conv.gen_structure_attrs_fromdict(cls)
    checked = [f for f in attrs.fields(cls) if f.validator is not None]

    def hook(value: object, _: object) -> object:
        if isinstance(value, Mapping):
            refused: list[Exception] = []
            for field in checked:
                if field.name not in value:
                    continue
                try:
                    field.validator(None, field, conv.structure(value[field.name], field.type))
                except Exception as exc:
                    note = f"Structuring class {cls.__qualname__} @ attribute {field.name}"
                    exc.__notes__ = [  # type: ignore[attr-defined]
                        *getattr(exc, "__notes__", []),
                        AttributeValidationNote(note, field.name, field.type),
                    ]
                    refused.append(exc)
            if refused:
                raise ClassValidationError(f"While structuring {cls.__name__}", refused, cls)
        return build(cast("Mapping[str, Any]", value), cls)

    return hook


converter.register_structure_hook_factory(_has_validators, _field_checked)


#: One step of the path to a value: a key of a table or an index of an array.
PathStep = str | int


@attrs.frozen
class Failure:
    """One value cattrs refused: where it is, what is wrong, and what kind of fault it is."""

    path: tuple[PathStep, ...]
    message: str
    #: "extra" (an unknown key), "missing" (a required key), or "bad" (a value of the wrong shape).
    kind: str

    @property
    def line(self) -> str:
        where = dotted(self.path)
        return f"{where}: {self.message}" if where else self.message


def dotted(path: tuple[PathStep, ...]) -> str:
    """``("tools", "declared", 0)`` as ``tools.declared[0]``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def failures(exc: BaseException, path: tuple[PathStep, ...] = ()) -> list[Failure]:
    """Flatten a cattrs error tree into one ``Failure`` per refused value."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [
            Failure(path=(*path, key), message="unknown key (check the spelling)", kind="extra")
            for key in sorted(exc.extra_fields)
        ]
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        found: list[Failure] = []
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            name = getattr(note, "name", None)
            index = getattr(note, "index", None)
            step = name if name is not None else index
            where = path if step is None else (*path, step)
            if isinstance(sub, KeyError):
                found.append(Failure(path=where, message="required key is missing", kind="missing"))
            else:
                found.extend(failures(sub, where))
        for sub in without:
            found.extend(failures(sub, path))
        return found
    return [Failure(path=path, message=str(exc) or type(exc).__name__, kind="bad")]


def describe_errors(exc: BaseException) -> list[str]:
    """Flatten a cattrs error tree into ``key.path: message`` lines."""
    return [failure.line for failure in failures(exc)]


T = TypeVar("T")


@attrs.frozen
class Structured(Generic[T]):
    """A file's value with every refused value left out, and a line for each one refused."""

    value: T
    problems: tuple[str, ...]
    #: The dotted paths of the values that were refused or missing: the value holds a default
    #: or a placeholder there, so the value checks of those keys must not run.
    refused: frozenset[str]

    def fine(self, *path: PathStep) -> bool:
        """Whether the value at ``path`` came from the file as written (its checks may run)."""
        return not any(dotted(path[:n]) in self.refused for n in range(1, len(path) + 1))


#: How many passes a file may take: each pass leaves out what the one before refused, and
#: values nest a few levels deep at most.
_MAX_PASSES = 8


def structure_leniently(data: Mapping[str, Any], cls: type[T]) -> Structured[T]:
    """Structure ``data`` into ``cls``, reporting every refused value at once.

    cattrs stops at the first level that fails, so the value checks of the keys that were
    right would only run once the author fixed the others (a second pass of ``check``). Each
    refused value is left out instead (an unknown key dropped, a wrong value dropped so its
    default applies, a missing required key given a placeholder of its type) and the rest is
    structured again, until it goes through. The caller runs the value checks on every key
    ``fine`` says came from the file.
    """
    current: Any = copy.deepcopy(dict(data))
    problems: list[str] = []
    refused: set[str] = set()
    for _ in range(_MAX_PASSES):
        try:
            value = converter.structure(current, cls)
        except Exception as exc:
            found = failures(exc)
            if not found:
                raise
            for failure in found:
                where = dotted(failure.path)
                # A required key whose wrong value was left out is missing on the next pass:
                # it was reported once, as the wrong value, and only gets its placeholder now.
                if where not in refused:
                    problems.append(failure.line)
                    refused.add(where)
                current = _repaired(current, failure, cls)
            continue
        return Structured(value=value, problems=tuple(problems), refused=frozenset(refused))
    raise RuntimeError(f"{cls.__name__}: the file's values did not settle in {_MAX_PASSES} passes")


def _repaired(data: Any, failure: Failure, cls: type) -> Any:
    """``data`` without the value ``failure`` refused, or with a placeholder for a missing key."""
    if not failure.path:
        return {} if failure.kind != "extra" else data
    parent = data
    for step in failure.path[:-1]:
        parent = parent[step]
    last = failure.path[-1]
    if failure.kind == "missing":
        parent[last] = _placeholder(_type_at(cls, failure.path))
    elif isinstance(last, int):
        # An array's bad element: keep the others (their checks still run); the index stays
        # taken by a placeholder so later indexes in the same pass still name their element.
        parent[last] = _placeholder(_type_at(cls, failure.path))
    else:
        parent.pop(last, None)
    return data


def _type_at(cls: type, path: tuple[PathStep, ...]) -> Any:
    """The declared type of the value at ``path`` inside ``cls``."""
    kind: Any = cls
    for step in path:
        kind = _without_none(kind)
        origin = get_origin(kind)
        if attrs.has(kind) and isinstance(step, str):
            # The private file classes use postponed annotations: their types are text
            # until resolved.
            fields = attrs.fields_dict(attrs.resolve_types(kind))
            if step not in fields:
                return Any
            kind = fields[step].type
        elif origin in (list, dict):
            kind = get_args(kind)[-1]
        else:
            return Any
    return kind


def _without_none(kind: Any) -> Any:
    """``X`` for ``X | None`` (the optional keys of a file), else ``kind`` itself."""
    args = [a for a in get_args(kind) if a is not type(None)]
    if type(None) in get_args(kind) and len(args) == 1:
        return args[0]
    return kind


def _placeholder(kind: Any) -> Any:
    """A value of ``kind`` that structures cleanly: it stands in for a refused or missing one."""
    origin = get_origin(kind)
    if attrs.has(kind) or origin is dict or kind is dict:
        return {}
    if origin is list or kind is list:
        return []
    if origin is not None and type(None) in get_args(kind):
        return None
    return {str: "", int: 0, float: 0.0, bool: False}.get(kind)
