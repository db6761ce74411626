"""The kafel form: nsjail's ``--seccomp_string`` policy text."""

from __future__ import annotations

from collections.abc import Sequence

from ._abi import _TABLES, X32_SYSCALL_BIT, _check_arch
from ._lists import _resolve
from ._rules import ArgCondition, ArgEquals, ArgHasBits, Condition, DenyList, Rule, _parts

# The x32 numbers the kafel form refuses explicitly (kafel has no x32 check; the
# kernel's x32 table currently ends near 550, so 1024 leaves room to grow).
_X32_SPAN = 1024


def _kafel_arg(cond: ArgCondition) -> str:
    # Masking with 0xffffffff makes kafel compare the low word only, whatever
    # size its own syscall table gives the argument.
    return f"({cond.name} & 0xffffffff)" if cond.width == 32 else cond.name


def _kafel_expr(cond: Condition) -> str:
    # Kafel separates alternatives with commas; a conjunction needs no parentheses.
    return " && ".join(_kafel_arg_expr(part) for part in _parts(cond))


def _kafel_arg_expr(cond: ArgCondition) -> str:
    arg = _kafel_arg(cond)
    if isinstance(cond, ArgEquals):
        return f"{arg} == {cond.value:#x}"
    if isinstance(cond, ArgHasBits):
        return f"({cond.name} & {cond.mask:#x}) != 0"
    return " && ".join(f"{arg} != {v:#x}" for v in cond.values)


def _kafel_params(conditions: Sequence[Condition]) -> str:
    conds = [part for cond in conditions for part in _parts(cond)]
    names = {c.index: c.name for c in conds}
    if len({(c.index, c.name) for c in conds}) != len(names):
        raise ValueError("conditions on one argument must use one name")
    return ", ".join(names.get(i, f"arg{i}") for i in range(max(names) + 1))


def to_kafel(deny_list: DenyList | str, arch: str, *, x32: bool = True) -> str:
    """Render a deny list as a kafel policy for nsjail's ``--seccomp_string`` on ``arch``.

    Kafel checks the architecture itself (a mismatch kills) but not the x32 bit,
    so on x86_64 the policy also kills every x32 call number explicitly, unless
    ``x32`` is false: only for a process that installs ``x32_guard`` itself.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    blocks: dict[int, list[str]] = {}
    grouped: dict[tuple[int, str], list[Rule]] = {}
    for rule in profile.rules_for(target):
        grouped.setdefault((rule.errno, rule.syscall), []).append(rule)
    for (err, syscall), rules in grouped.items():
        # By number, named in a comment: kafel's own tables differ between
        # versions (this one spells umount2 differently, older ones lack the
        # newer calls), while our numbers are the ones compile_bpf uses.
        entry = f"SYSCALL[{_TABLES[target][syscall]}] /* {syscall} */"
        conds = [r.when for r in rules if r.when is not None]
        if conds:
            exprs = ", ".join(_kafel_expr(c) for c in conds)
            entry += f" ({_kafel_params(conds)}) {{ {exprs} }}"
        blocks.setdefault(err, []).append(entry)
    name = f"astralvessel_{profile.name}"
    parts: list[str] = []
    if target == "x86_64" and x32:
        numbers = ", ".join(f"SYSCALL[{X32_SYSCALL_BIT + n:#x}]" for n in range(_X32_SPAN))
        parts.append(f"  KILL_PROCESS {{ {numbers} }}")
    for err in sorted(blocks):
        body = ",\n".join(f"    {entry}" for entry in blocks[err])
        parts.append(f"  ERRNO({err}) {{\n{body}\n  }}")
    joined = ",\n".join(parts)
    return f"POLICY {name} {{\n{joined}\n}}\nUSE {name} DEFAULT ALLOW\n"
