"""The seccomp deny lists: one source of truth, compiled into every form a backend needs.

The package keeps the list apart from its forms, one module each:

- ``_abi``: the kernel's numbers (architectures, system calls, argument values);
- ``_rules``: ``DenyList``, ``Rule`` and the argument conditions, with the
  reference semantics (``DenyList.decide``);
- ``_lists``: the shipped lists (``CALLS``, ``SERVER``, ``HELPERS``, ...);
- ``_bpf``: ``compile_bpf``, a raw classic-BPF program (``struct sock_filter[]``),
  what ``prctl(PR_SET_SECCOMP)`` and bubblewrap's ``--seccomp FD`` take, and
  ``x32_guard``;
- ``_kafel``: ``to_kafel``, nsjail's ``--seccomp_string`` policy text;
- ``_docker``: ``to_docker_profile``, Docker's JSON seccomp profile.

Every form checks the architecture first (a foreign ABI such as i386 or x32 kills
the process) and compares 32-bit arguments on their low word only, because the
kernel truncates them (a filter comparing all 64 bits can be bypassed by setting
the high word, as ``ioctl(TIOCSTI | 1 << 32)`` did against several sandboxes).
A new condition type is a rule, a ``decide`` case and one emitter per form: the
tests hold all of them against each other. Every name is imported from here.
"""

from __future__ import annotations

from ._abi import _TABLES as _TABLES
from ._abi import AF_INET as AF_INET
from ._abi import AF_INET6 as AF_INET6
from ._abi import AF_NETLINK as AF_NETLINK
from ._abi import AF_UNIX as AF_UNIX
from ._abi import ARCHES as ARCHES
from ._abi import AUDIT_ARCH as AUDIT_ARCH
from ._abi import AUDIT_ARCH_I386 as AUDIT_ARCH_I386
from ._abi import CALL_SOCKET_FAMILIES as CALL_SOCKET_FAMILIES
from ._abi import CLONE_NEWCGROUP as CLONE_NEWCGROUP
from ._abi import CLONE_NEWIPC as CLONE_NEWIPC
from ._abi import CLONE_NEWNET as CLONE_NEWNET
from ._abi import CLONE_NEWNS as CLONE_NEWNS
from ._abi import CLONE_NEWPID as CLONE_NEWPID
from ._abi import CLONE_NEWTIME as CLONE_NEWTIME
from ._abi import CLONE_NEWUSER as CLONE_NEWUSER
from ._abi import CLONE_NEWUTS as CLONE_NEWUTS
from ._abi import F_NOTIFY as F_NOTIFY
from ._abi import F_SETLEASE as F_SETLEASE
from ._abi import NAMESPACE_FLAGS as NAMESPACE_FLAGS
from ._abi import NETLINK_AUDIT as NETLINK_AUDIT
from ._abi import NETLINK_ROUTE as NETLINK_ROUTE
from ._abi import NETLINK_SOCK_DIAG as NETLINK_SOCK_DIAG
from ._abi import O_CREAT as O_CREAT
from ._abi import O_TMPFILE_BIT as O_TMPFILE_BIT
from ._abi import PER_LINUX as PER_LINUX
from ._abi import PERSONALITY_QUERY as PERSONALITY_QUERY
from ._abi import S_ISGID as S_ISGID
from ._abi import S_ISUID as S_ISUID
from ._abi import SERVER_SOCKET_FAMILIES as SERVER_SOCKET_FAMILIES
from ._abi import TIOCLINUX as TIOCLINUX
from ._abi import TIOCSTI as TIOCSTI
from ._abi import X32_SYSCALL_BIT as X32_SYSCALL_BIT
from ._abi import Arch as Arch
from ._abi import available_arch as available_arch
from ._abi import syscall_number as syscall_number
from ._bpf import BPF_JMP_JA as BPF_JMP_JA
from ._bpf import BPF_JMP_JEQ_K as BPF_JMP_JEQ_K
from ._bpf import BPF_JMP_JGE_K as BPF_JMP_JGE_K
from ._bpf import BPF_JMP_JSET_K as BPF_JMP_JSET_K
from ._bpf import BPF_LD_W_ABS as BPF_LD_W_ABS
from ._bpf import BPF_MAXINSNS as BPF_MAXINSNS
from ._bpf import BPF_RET_K as BPF_RET_K
from ._bpf import SECCOMP_RET_ALLOW as SECCOMP_RET_ALLOW
from ._bpf import SECCOMP_RET_ERRNO as SECCOMP_RET_ERRNO
from ._bpf import SECCOMP_RET_KILL_PROCESS as SECCOMP_RET_KILL_PROCESS
from ._bpf import _Assembler as _Assembler
from ._bpf import compile_bpf as compile_bpf
from ._bpf import compiled as compiled
from ._bpf import helper_programs as helper_programs
from ._bpf import resolve as resolve
from ._bpf import x32_guard as x32_guard
from ._docker import to_docker_profile as to_docker_profile
from ._kafel import to_kafel as to_kafel
from ._lists import CALLS as CALLS
from ._lists import CALLS_AS_ROOT as CALLS_AS_ROOT
from ._lists import CALLS_AS_ROOT_TOOL_SERVERS as CALLS_AS_ROOT_TOOL_SERVERS
from ._lists import CALLS_TOOL_SERVERS as CALLS_TOOL_SERVERS
from ._lists import FILE_WORKER as FILE_WORKER
from ._lists import HELPERS as HELPERS
from ._lists import PROFILES as PROFILES
from ._lists import RELAY as RELAY
from ._lists import SERVER as SERVER
from ._lists import SERVER_ALLOWANCES as SERVER_ALLOWANCES
from ._lists import calls_list as calls_list
from ._rules import AllOf as AllOf
from ._rules import ArgCondition as ArgCondition
from ._rules import ArgEquals as ArgEquals
from ._rules import ArgHasBits as ArgHasBits
from ._rules import ArgNotIn as ArgNotIn
from ._rules import Condition as Condition
from ._rules import DenyList as DenyList
from ._rules import Rule as Rule

__all__ = [
    "CALLS",
    "CALLS_AS_ROOT",
    "CALLS_AS_ROOT_TOOL_SERVERS",
    "CALLS_TOOL_SERVERS",
    "FILE_WORKER",
    "HELPERS",
    "PROFILES",
    "RELAY",
    "SERVER",
    "SERVER_ALLOWANCES",
    "AllOf",
    "Arch",
    "ArgEquals",
    "ArgHasBits",
    "ArgNotIn",
    "Condition",
    "DenyList",
    "Rule",
    "available_arch",
    "calls_list",
    "compile_bpf",
    "compiled",
    "helper_programs",
    "syscall_number",
    "to_docker_profile",
    "to_kafel",
    "x32_guard",
]
