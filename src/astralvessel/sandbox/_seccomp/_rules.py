"""The deny list and its reference semantics.

A ``DenyList`` is a named tuple of ``Rule`` values, each naming one system call,
an optional argument ``Condition`` and the errno the caller sees.
``DenyList.decide`` is the reference semantics: what a call with given
arguments gets, as the kernel would decide under every compiled form
(``_bpf``, ``_kafel``, ``_docker``); the tests hold each form against it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence
from typing import TypeAlias

import attrs

from ._abi import _MASK32, _TABLES, Arch


def _check_index(_inst: object, _attr: object, value: int) -> None:
    if not 0 <= value <= 5:
        raise ValueError(f"argument index must be 0..5, not {value}")


def _check_width(_inst: object, _attr: object, value: int) -> None:
    if value not in (32, 64):
        raise ValueError(f"argument width must be 32 or 64, not {value}")


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class ArgEquals:
    """Matches when argument ``index`` equals ``value``.

    ``width`` is the argument's C type: 32 for ``int``/``unsigned int`` (the
    kernel ignores the high word, so only the low word is compared), 64 for
    ``long``/pointers (both words compared).
    """

    index: int = attrs.field(validator=_check_index)
    name: str
    value: int
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.value < 1 << self.width:
            raise ValueError(f"{self.name} == {self.value:#x} does not fit {self.width} bits")


@attrs.frozen(kw_only=True)
class ArgHasBits:
    """Matches when argument ``index`` has any bit of ``mask`` set."""

    index: int = attrs.field(validator=_check_index)
    name: str
    mask: int
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not 0 < self.mask < 1 << self.width:
            raise ValueError(
                f"mask {self.mask:#x} of {self.name} must be non-zero and fit {self.width} bits"
            )


@attrs.frozen(kw_only=True)
class ArgNotIn:
    """Matches when argument ``index`` is none of ``values`` (an allow-list of values)."""

    index: int = attrs.field(validator=_check_index)
    name: str
    values: tuple[int, ...] = attrs.field(converter=_int_tuple)
    width: int = attrs.field(default=32, validator=_check_width)

    def __attrs_post_init__(self) -> None:
        if not self.values or any(not 0 <= v < 1 << self.width for v in self.values):
            raise ValueError(f"values of {self.name} must be non-empty and fit {self.width} bits")


ArgCondition: TypeAlias = ArgEquals | ArgHasBits | ArgNotIn


def _arg_tuple(conditions: Iterable[ArgCondition]) -> tuple[ArgCondition, ...]:
    return tuple(conditions)


@attrs.frozen(kw_only=True)
class AllOf:
    """Matches when every one of ``conditions`` holds, each on a different argument.

    One argument per condition keeps every form able to express it: libseccomp
    (Docker) takes at most one comparison per argument in a rule.
    """

    conditions: tuple[ArgCondition, ...] = attrs.field(converter=_arg_tuple)

    def __attrs_post_init__(self) -> None:
        indexes = [c.index for c in self.conditions]
        if len(indexes) < 2 or len(set(indexes)) != len(indexes):
            raise ValueError(
                f"AllOf needs two or more conditions on distinct arguments, not {indexes}"
            )
        if not all(isinstance(c, ArgEquals | ArgHasBits | ArgNotIn) for c in self.conditions):
            raise ValueError("AllOf holds argument conditions only")


Condition: TypeAlias = ArgCondition | AllOf


def _arg_matches(cond: ArgCondition, raw: int) -> bool:
    """Whether ``cond`` holds for a raw 64-bit argument, as the kernel would see it."""
    value = raw & _MASK32 if cond.width == 32 else raw
    if isinstance(cond, ArgEquals):
        return value == cond.value
    if isinstance(cond, ArgHasBits):
        return value & cond.mask != 0
    return value not in cond.values


def _parts(cond: Condition) -> tuple[ArgCondition, ...]:
    return cond.conditions if isinstance(cond, AllOf) else (cond,)


def _condition_matches(cond: Condition, args: Sequence[int]) -> bool:
    """Whether ``cond`` holds for a call's six raw arguments."""
    return all(_arg_matches(part, args[part.index]) for part in _parts(cond))


@attrs.frozen(kw_only=True)
class Rule:
    """One refused system call: refused always, or only when ``when`` holds.

    ``errno`` is what the caller sees; 0 answers success without running the
    call (``CALLS_AS_ROOT``'s chowns).
    """

    syscall: str
    why: str
    when: Condition | None = None
    errno: int = errno.EPERM

    def __attrs_post_init__(self) -> None:
        if not any(self.syscall in table for table in _TABLES.values()):
            raise ValueError(f"unknown system call {self.syscall!r}: add its numbers to the tables")
        if not 0 <= self.errno < 4096:
            raise ValueError(f"errno for {self.syscall} must be 0..4095, not {self.errno}")

    def matches(self, args: Sequence[int]) -> bool:
        """Whether a call with these six raw arguments is refused by this rule."""
        return self.when is None or _condition_matches(self.when, args)


def _rule_tuple(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    return tuple(rules)


@attrs.frozen(kw_only=True)
class DenyList:
    """A named, ordered set of refused system calls; everything else is allowed."""

    name: str
    rules: tuple[Rule, ...] = attrs.field(converter=_rule_tuple)

    def __attrs_post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"deny list name {self.name!r} must be an identifier")
        unconditional = [r.syscall for r in self.rules if r.when is None]
        duplicates = sorted({s for s in unconditional if unconditional.count(s) > 1})
        mixed = sorted({r.syscall for r in self.rules if r.when is not None} & set(unconditional))
        if duplicates or mixed:
            raise ValueError(f"deny list {self.name!r} lists {duplicates + mixed} more than once")

    @property
    def syscalls(self) -> tuple[str, ...]:
        """The names of every system call with a rule, in order, each once."""
        return tuple(dict.fromkeys(r.syscall for r in self.rules))

    def without(self, *syscalls: str, name: str) -> DenyList:
        """A copy named ``name`` that no longer refuses ``syscalls`` (all their rules)."""
        unknown = set(syscalls) - set(self.syscalls)
        if unknown:
            raise ValueError(f"deny list {self.name!r} has no rules for {sorted(unknown)}")
        return DenyList(name=name, rules=tuple(r for r in self.rules if r.syscall not in syscalls))

    def unconditional(self, *, name: str) -> DenyList:
        """A copy named ``name`` with only the rules that refuse a call whatever its arguments.

        Docker's server containers take it as the engine's profile: libseccomp, which runc
        uses, spends milliseconds on each argument condition at every container's start.
        """
        return DenyList(name=name, rules=tuple(r for r in self.rules if r.when is None))

    def rules_for(self, arch: Arch) -> tuple[Rule, ...]:
        """The rules whose system call exists on ``arch``."""
        return tuple(r for r in self.rules if r.syscall in _TABLES[arch])

    def decide(self, syscall: str, args: Sequence[int] = (0,) * 6) -> int | None:
        """The errno a call gets under this list, or None if allowed: the reference semantics."""
        padded = (*args, *(0,) * (6 - len(args)))
        for rule in self.rules:
            if rule.syscall == syscall and rule.matches(padded):
                return rule.errno
        return None
