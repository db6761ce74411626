"""The classic-BPF form: the program ``prctl(PR_SET_SECCOMP)`` and bubblewrap take.

``compile_bpf`` turns a deny list into a raw ``struct sock_filter[]``, what the
sandbox server installs for each call (``server/_seccomp.py``), what
bubblewrap reads from ``--seccomp FD`` and what the Docker server's bootstrap
installs; ``compiled`` and ``helper_programs`` keep one per process.
``x32_guard`` is the small program stacked on nsjail's kafel policy. Below
them, a tiny assembler with labels lays out forward jumps.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeAlias

import attrs

from ..server._seccomp import INSN_SIZE, MAX_INSNS
from ._abi import _MASK32, _TABLES, AUDIT_ARCH, X32_SYSCALL_BIT, Arch, _check_arch
from ._lists import HELPERS, _resolve
from ._rules import ArgCondition, ArgEquals, ArgHasBits, Condition, DenyList, Rule, _parts

# <linux/seccomp.h> return actions.
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# Classic BPF opcodes (<linux/filter.h>) and the kernel's program length limit.
BPF_LD_W_ABS = 0x20
BPF_JMP_JA = 0x05
BPF_JMP_JEQ_K = 0x15
BPF_JMP_JGE_K = 0x35
BPF_JMP_JSET_K = 0x45
BPF_RET_K = 0x06
BPF_MAXINSNS = MAX_INSNS  # one definition, the server's installer checks it too

# struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; }
_OFFSET_NR = 0
_OFFSET_ARCH = 4


# ---------------------------------------------------------------------------
# Classic BPF: a tiny assembler with labels. Conditional jumps carry 8-bit
# offsets, so a branch whose target is too far is routed through an
# unconditional `ja` (32-bit offset) placed right after the jump.


@attrs.frozen
class _Label:
    id: int


@attrs.frozen
class _Stmt:
    code: int
    k: int


@attrs.frozen
class _Jump:
    code: int
    k: int
    jt: _Label | None  # None: the next instruction
    jf: _Label | None


@attrs.frozen
class _Goto:
    target: _Label


@attrs.frozen
class _Mark:
    label: _Label


_Item: TypeAlias = _Stmt | _Jump | _Goto | _Mark


class _Assembler:
    """Collects instructions with symbolic forward jumps and resolves them to bytes."""

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self._next_label = 0

    def label(self) -> _Label:
        self._next_label += 1
        return _Label(self._next_label)

    def mark(self, label: _Label) -> None:
        self.items.append(_Mark(label))

    def load(self, offset: int) -> None:
        self.items.append(_Stmt(BPF_LD_W_ABS, offset))

    def ret(self, value: int) -> None:
        self.items.append(_Stmt(BPF_RET_K, value))

    def jump(self, code: int, k: int, jt: _Label | None = None, jf: _Label | None = None) -> None:
        self.items.append(_Jump(code, k & _MASK32, jt, jf))

    def goto(self, target: _Label) -> None:
        self.items.append(_Goto(target))

    def assemble(self) -> bytes:
        return b"".join(struct.pack("<HBBI", *insn) for insn in resolve(self.items))


def _layout(
    items: Sequence[_Item], far: set[tuple[int, str]]
) -> tuple[list[int], dict[int, int], int]:
    """Instruction index of every item and label, and the program length, given the far branches."""
    starts: list[int] = []
    labels: dict[int, int] = {}
    pc = 0
    for i, item in enumerate(items):
        starts.append(pc)
        if isinstance(item, _Mark):
            labels[item.label.id] = pc
        elif isinstance(item, _Jump):
            pc += 1 + sum((i, side) in far for side in ("jt", "jf"))
        else:
            pc += 1
    return starts, labels, pc


def _distance(labels: Mapping[int, int], label: _Label | None, fallthrough: int, pc: int) -> int:
    """The forward offset from the instruction at ``pc`` to ``label`` (None: ``fallthrough``)."""
    if label is not None and label.id not in labels:
        raise ValueError(f"BPF label {label.id} is never placed")
    offset = (fallthrough if label is None else labels[label.id]) - pc - 1
    if offset < 0:
        raise ValueError("classic BPF cannot jump backwards")
    return offset


def resolve(items: Sequence[_Item]) -> list[tuple[int, int, int, int]]:
    """Lay out ``items`` as ``(code, jt, jf, k)`` instructions, adding trampolines for far jumps."""
    far: set[tuple[int, str]] = set()  # (item index, "jt" | "jf") routed through a trampoline
    while True:
        starts, labels, end = _layout(items, far)
        grown = False
        out: list[tuple[int, int, int, int]] = []
        for i, item in enumerate(items):
            pc = starts[i]
            if isinstance(item, _Stmt):
                out.append((item.code, 0, 0, item.k))
            elif isinstance(item, _Goto):
                out.append((BPF_JMP_JA, 0, 0, _distance(labels, item.target, end, pc)))
            elif isinstance(item, _Jump):
                tramps = [side for side in ("jt", "jf") if (i, side) in far]
                after = pc + 1 + len(tramps)
                branches = {"jt": item.jt, "jf": item.jf}
                offsets = {}
                for side, label in branches.items():
                    offsets[side] = (
                        tramps.index(side)
                        if side in tramps
                        else _distance(labels, label, after, pc)
                    )
                    if offsets[side] > 0xFF:
                        far.add((i, side))
                        grown = True
                out.append((item.code, offsets["jt"], offsets["jf"], item.k))
                for n, side in enumerate(tramps):
                    ja_pc = pc + 1 + n
                    out.append((BPF_JMP_JA, 0, 0, _distance(labels, branches[side], after, ja_pc)))
        if not grown:
            return out


def _arg_offsets(index: int) -> tuple[int, int]:
    # Both supported architectures are little-endian: the low word comes first.
    low = 16 + 8 * index
    return low, low + 4


def _emit_condition(asm: _Assembler, cond: Condition, match: _Label, miss: _Label) -> None:
    parts = _parts(cond)
    for part in parts[:-1]:
        holds = asm.label()
        _emit_arg(asm, part, holds, miss)
        asm.mark(holds)
    _emit_arg(asm, parts[-1], match, miss)


def _emit_arg(asm: _Assembler, cond: ArgCondition, match: _Label, miss: _Label) -> None:
    low, high = _arg_offsets(cond.index)
    if isinstance(cond, ArgEquals):
        if cond.width == 64:
            asm.load(high)
            asm.jump(BPF_JMP_JEQ_K, cond.value >> 32, None, miss)
        asm.load(low)
        asm.jump(BPF_JMP_JEQ_K, cond.value, match, miss)
    elif isinstance(cond, ArgHasBits):
        if cond.mask >> 32:
            asm.load(high)
            asm.jump(BPF_JMP_JSET_K, cond.mask >> 32, match, None)
        if cond.mask & _MASK32:
            asm.load(low)
            asm.jump(BPF_JMP_JSET_K, cond.mask, match, miss)
        else:
            asm.goto(miss)
    else:
        for value in cond.values:
            next_value = asm.label()
            if cond.width == 64:
                asm.load(high)
                asm.jump(BPF_JMP_JEQ_K, value >> 32, None, next_value)
            asm.load(low)
            asm.jump(BPF_JMP_JEQ_K, value, miss, next_value)
            asm.mark(next_value)
        asm.goto(match)


def _by_syscall(rules: Sequence[Rule], arch: Arch) -> Iterator[tuple[int, list[Rule]]]:
    grouped: dict[str, list[Rule]] = {}
    for rule in rules:
        grouped.setdefault(rule.syscall, []).append(rule)
    table = _TABLES[arch]
    for name in sorted(grouped, key=lambda n: table[n]):
        yield table[name], grouped[name]


def compile_bpf(deny_list: DenyList | str, arch: str) -> bytes:
    """Compile a deny list to a classic-BPF seccomp program for ``arch``.

    The result is an array of ``struct sock_filter`` (8 bytes each, little-endian
    like both supported architectures): what ``prctl(PR_SET_SECCOMP)`` installs
    and what bubblewrap reads from ``--seccomp FD``. It kills the process on any
    other architecture (i386 via ``int 0x80``, AArch32) and on x32 call numbers,
    returns the rule's errno for a refused call and allows everything else.
    """
    profile = _resolve(deny_list)
    target = _check_arch(arch)
    asm = _Assembler()
    kill = asm.label()
    asm.load(_OFFSET_ARCH)
    asm.jump(BPF_JMP_JEQ_K, AUDIT_ARCH[target], None, kill)
    asm.load(_OFFSET_NR)
    if target == "x86_64":
        native = asm.label()
        asm.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, None, native)
        # -1 is no call at all (tracers use it to skip one); the kernel answers ENOSYS.
        asm.jump(BPF_JMP_JEQ_K, _MASK32, native, kill)
        asm.mark(native)
    for number, rules in _by_syscall(profile.rules_for(target), target):
        next_syscall = asm.label()
        asm.jump(BPF_JMP_JEQ_K, number, None, next_syscall)
        if rules[0].when is None:
            asm.ret(SECCOMP_RET_ERRNO | rules[0].errno)
        else:
            reload = asm.label()
            for i, rule in enumerate(rules):
                assert rule.when is not None  # noqa: S101 -- DenyList forbids mixing
                refuse = asm.label()
                miss = reload if i == len(rules) - 1 else asm.label()
                _emit_condition(asm, rule.when, refuse, miss)
                asm.mark(refuse)
                asm.ret(SECCOMP_RET_ERRNO | rule.errno)
                if miss is not reload:
                    asm.mark(miss)
            # Argument checks overwrote the accumulator: load the call number again.
            asm.mark(reload)
            asm.load(_OFFSET_NR)
        asm.mark(next_syscall)
    asm.ret(SECCOMP_RET_ALLOW)
    asm.mark(kill)
    asm.ret(SECCOMP_RET_KILL_PROCESS)
    program = asm.assemble()
    if len(program) // INSN_SIZE > BPF_MAXINSNS:
        raise ValueError(
            f"seccomp program for {profile.name!r} exceeds {BPF_MAXINSNS} instructions"
        )
    return program


@functools.cache
def compiled(deny_list: DenyList, arch: str) -> bytes:
    """``compile_bpf`` once per process for each list and architecture: every turn start of
    every backend would assemble the same program again (3-5 ms each).

    Raises ``ValueError`` as ``compile_bpf`` does.
    """
    return compile_bpf(deny_list, arch)


@functools.cache
def helper_programs(arch: str) -> Mapping[str, bytes]:
    """Each of ``HELPERS`` compiled for ``arch``, by helper name (``compiled``).

    Raises ``ValueError`` for an architecture ``compile_bpf`` does not support.
    """
    return {name: compiled(deny_list, arch) for name, deny_list in HELPERS.items()}


def x32_guard(arch: str) -> bytes | None:
    """A program that kills x32 calls and allows every other: None where there is no x32.

    Stacked on a kafel policy rendered with ``to_kafel(..., x32=False)``, it
    refuses what that policy's x32 block did, in 5 instructions instead of 1024
    entries that nsjail compiles and keeps a quarter of a MiB of heap for, in
    every turn's sandbox.
    """
    if _check_arch(arch) != "x86_64":
        return None
    asm = _Assembler()
    allow, kill = asm.label(), asm.label()
    asm.load(_OFFSET_NR)
    asm.jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, None, allow)
    # -1 is no call at all (tracers use it to skip one), as in compile_bpf.
    asm.jump(BPF_JMP_JEQ_K, _MASK32, allow, kill)
    asm.mark(allow)
    asm.ret(SECCOMP_RET_ALLOW)
    asm.mark(kill)
    asm.ret(SECCOMP_RET_KILL_PROCESS)
    return asm.assemble()
