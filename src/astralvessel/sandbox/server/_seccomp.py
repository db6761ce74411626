"""Install a compiled seccomp program in this process (stdlib only, Python 3.8+).

The sandbox server calls ``install`` in a forked child right before ``execve``:
the program (built on the host by ``astralvessel.sandbox._seccomp.compile_bpf``)
then confines the call and everything it starts. The filter applies to the
calling thread and is inherited across fork and exec; it can never be removed.
"""

from __future__ import annotations

import ctypes
import os

# Annotations only: collections.abc imports collections, which every idle turn would hold.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["install", "prepare"]

PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
#: sizeof(struct sock_filter), and the kernel's limit on one program (BPF_MAXINSNS): the
#: host's compiler (``sandbox/_seccomp/_bpf.py``) builds programs to fit them.
INSN_SIZE = 8
MAX_INSNS = 4096


class _SockFprog(ctypes.Structure):
    """struct sock_fprog { unsigned short len; struct sock_filter *filter; }"""

    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_prctl_function: Callable[..., int] | None = None
# The last program made ready, kept alive with the buffer its sock_fprog points into.
_prepared: tuple[bytes, ctypes.Array[ctypes.c_char], _SockFprog] | None = None


def _prctl() -> Callable[..., int]:
    global _prctl_function  # noqa: PLW0603 - resolved once, inherited by every fork
    if _prctl_function is None:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.argtypes = (
            ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong
        )  # fmt: skip
        prctl.restype = ctypes.c_int
        _prctl_function = prctl
    return _prctl_function


def prepare(program: bytes) -> _SockFprog:
    """Check ``program`` and build its ``sock_fprog`` once; later calls reuse it.

    The server prepares its calls' program before it forks them, so no call pays
    for loading libc or building the structure. Raises ``ValueError`` if
    ``program`` is not a whole number of instructions (1 to 4096).
    """
    global _prepared  # noqa: PLW0603 - one program per server
    if _prepared is not None and _prepared[0] == program:
        return _prepared[2]
    size = len(program)
    if size == 0 or size % INSN_SIZE or size // INSN_SIZE > MAX_INSNS:
        raise ValueError(
            f"a seccomp program is 1 to {MAX_INSNS} instructions of {INSN_SIZE} bytes, "
            f"not {size} bytes; build it with compile_bpf"
        )
    _prctl()
    buffer = ctypes.create_string_buffer(program, size)
    fprog = _SockFprog(size // INSN_SIZE, ctypes.cast(buffer, ctypes.c_void_p))
    _prepared = (program, buffer, fprog)
    return fprog


def install(program: bytes) -> None:
    """Set ``no_new_privs`` and install ``program`` as this thread's seccomp filter.

    Raises ``ValueError`` if ``program`` is not a whole number of instructions
    (1 to 4096) and ``OSError`` if the kernel refuses either step.
    """
    fprog = prepare(program)
    prctl = _prctl()
    # Without no_new_privs an unprivileged process may not install a filter, and
    # a setuid program run later could otherwise shed it.
    if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(
            err,
            f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}; "
            "the kernel is too old or forbids it",
        )
    if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(
            err,
            f"prctl(PR_SET_SECCOMP) refused the filter: {os.strerror(err)}; "
            "the kernel lacks CONFIG_SECCOMP_FILTER or the program is malformed (EINVAL), "
            "or too many filters are stacked (ENOMEM)",
        )
