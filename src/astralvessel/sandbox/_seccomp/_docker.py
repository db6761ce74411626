"""The Docker form: the JSON seccomp profile the engine takes (libseccomp underneath, via runc)."""

from __future__ import annotations

from collections.abc import Mapping

from ._abi import _MASK32, Arch, _check_arch
from ._lists import _resolve
from ._rules import ArgCondition, ArgEquals, ArgHasBits, ArgNotIn, Condition, DenyList, _parts

_DOCKER_ARCH: Mapping[Arch, str] = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}


def _masked(index: int, mask: int, expected: int) -> dict[str, object]:
    return {"index": index, "value": mask, "valueTwo": expected, "op": "SCMP_CMP_MASKED_EQ"}


def _docker_arg_sets(cond: Condition) -> list[list[dict[str, object]]]:
    """Alternatives (OR) of argument lists (AND); libseccomp takes one comparison per argument."""
    alternatives: list[list[dict[str, object]]] = [[]]
    # A conjunction of per-argument alternatives is every combination of them;
    # AllOf puts each condition on its own argument, so each combination is valid.
    for part in _parts(cond):
        alternatives = [a + b for a in alternatives for b in _docker_arg_alternatives(part)]
    return alternatives


#: The most bits an allow-list's values may span for Docker's form (2**n comparisons).
_DOCKER_SPAN_BITS = 6


def _docker_arg_alternatives(cond: ArgCondition) -> list[list[dict[str, object]]]:
    if isinstance(cond, ArgEquals):
        if cond.width == 64:
            return [[{"index": cond.index, "value": cond.value, "op": "SCMP_CMP_EQ"}]]
        # A mask of 0xffffffff compares the low word only: the kernel ignores the high one.
        return [[_masked(cond.index, _MASK32, cond.value)]]
    if isinstance(cond, ArgHasBits):
        bits = [1 << b for b in range(cond.width) if cond.mask >> b & 1]
        return [[_masked(cond.index, bit, bit)] for bit in bits]
    return _docker_not_in(cond)


def _docker_not_in(cond: ArgNotIn) -> list[list[dict[str, object]]]:
    values = set(cond.values)
    span = 0
    for value in values:
        span |= value
    if span.bit_count() <= _DOCKER_SPAN_BITS:
        # Every allowed value uses only the bits of ``span``: a value with any other
        # bit set is refused by one comparison per such bit, and a value within the
        # span by one exact comparison for each pattern of its bits not allowed.
        outside = [
            [_masked(cond.index, 1 << b, 1 << b)] for b in range(cond.width) if not span >> b & 1
        ]
        inside = [
            [_masked(cond.index, span, pattern)]
            for pattern in _sub_patterns(span)
            if pattern not in values
        ]
        return outside + inside
    if cond.width == 32 and values == {_MASK32}:  # some bit clear
        return [[_masked(cond.index, 1 << b, 0)] for b in range(32)]
    if cond.width == 32 and values == {0, _MASK32}:
        # Neither all zeros nor all ones: somewhere (cyclically) a set bit is
        # followed by a clear one, so these 32 single comparisons cover it exactly.
        return [[_masked(cond.index, 1 << b | 1 << (b + 1) % 32, 1 << b)] for b in range(32)]
    raise ValueError(
        f"Docker's profile format cannot express {cond.name} not in {sorted(values)}; "
        f"use values spanning at most {_DOCKER_SPAN_BITS} bits, or drawn from 0 and 0xffffffff"
    )


def _sub_patterns(span: int) -> list[int]:
    """Every value whose set bits are a subset of ``span``'s."""
    bits = [1 << b for b in range(span.bit_length()) if span >> b & 1]
    return [sum(bit for i, bit in enumerate(bits) if n >> i & 1) for n in range(1 << len(bits))]


def to_docker_profile(deny_list: DenyList | str, arch: str) -> dict[str, object]:
    """Render a deny list as Docker's JSON seccomp profile (``--security-opt seccomp=FILE``).

    Only ``arch`` is listed under ``architectures``: libseccomp then treats
    every other ABI, x32 included, as a bad architecture and kills the caller.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    entries: list[dict[str, object]] = []
    plain: dict[int, list[str]] = {}
    for rule in profile.rules_for(target):
        if rule.when is None:
            plain.setdefault(rule.errno, []).append(rule.syscall)
            continue
        for args in _docker_arg_sets(rule.when):
            entries.append(
                {
                    "names": [rule.syscall],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": rule.errno,
                    "args": args,
                    "comment": rule.why,
                }
            )
    unconditional = [
        {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": err, "args": []}
        for err, names in sorted(plain.items())
    ]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [_DOCKER_ARCH[target]],
        "syscalls": unconditional + entries,
    }
