"""The PID namespace of an nsjail turn, made by util-linux ``unshare`` so no nsjail stays.

nsjail's once mode (``--mode o``) clones the sandbox and then stays, as the
server's parent, for the turn's whole life: about 1.3 MiB of every idle turn
(its heap, and the pages of its dynamically linked binary and bundled
``libprotobuf``, which only other nsjail processes share). Its execve mode
(``--mode e``) builds the namespaces, mounts, rlimits and seccomp filter in its
own process and then *becomes* the command. A PID namespace only takes the
children of whoever makes it, though: in that mode nsjail forks a copy of
itself as the namespace's init and keeps that one resident instead, and with
``--disable_clone_newpid`` its ``/proc`` would be the host's (or, in a user
namespace, cannot be mounted at all: the host's PID namespace is not the user
namespace's to show).

So util-linux ``unshare --pid --fork --kill-child`` starts first, on the host:
a small C program (about 0.1 MiB of a turn) that makes the PID namespace (and,
without root, the user namespace that owns it, mapping only the caller to uid
0, as nsjail's ``--user 0:uid:1`` did), forks nsjail into it as its pid 1, waits
and ends as its child ended, and kills the child (``PR_SET_PDEATHSIG``) if it
is killed itself. nsjail, told to make neither namespace, mounts ``/proc`` for
the PID namespace it is already in and becomes the server, which is then the
namespace's pid 1 as before. A host without such an ``unshare`` keeps nsjail's
once mode.
"""

from __future__ import annotations

import functools

from ._hostinfo import run_for_text, system_binaries

__all__ = ["find_unshare", "unshare_argv"]

#: What the turn's start needs of ``unshare``: each option named in its ``--help``.
NEEDED = ("--pid", "--fork", "--kill-child", "--map-root-user")


def unshare_argv(unshare: str, *, is_root: bool) -> list[str]:
    """The prefix that starts a command as pid 1 of a new PID namespace, killed with us.

    Without root the namespace needs a user namespace of its own to be made in,
    where the caller is uid 0 (and gid 0).
    """
    argv = [unshare, "--pid", "--fork", "--kill-child"]
    return argv + ([] if is_root else ["--map-root-user"]) + ["--"]


@functools.cache
def find_unshare() -> str | None:
    """The path of a host ``unshare`` with every ``NEEDED`` option, else ``None``.

    Asked once per process: running ``--help`` costs a few milliseconds.
    """
    for path in system_binaries("unshare"):
        help_text = run_for_text([path, "--help"])
        if all(option in help_text for option in NEEDED):
            return path
    return None
