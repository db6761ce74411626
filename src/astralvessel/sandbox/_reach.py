"""Whether the call's identity can use each host folder a turn mounts, checked before it opens.

A folder the host names but the sandbox's user cannot read (a
``tempfile.mkdtemp()`` folder is mode 0700; an agent folder written under
umask 077 is too) would otherwise fail inside the call, and the model would
see ``Permission denied`` for a mistake only the host can fix. So a backend
checks every mount, and the agent folder, when the turn opens and raises
``UsageError`` naming the host path and the fix.

``mode_refusal`` decides from plain ``os.stat`` values (owner, group and
mode bits, as the kernel checks them without ACLs); ``refusals`` is the thin
shell that stats each path.
"""

from __future__ import annotations

import os
import stat

import attrs

from ..errors import UsageError
from ._policy import AGENT_DIR, Policy

__all__ = ["Identity", "check_reach", "mode_refusal", "refusals"]

_READ, _WRITE, _SEARCH = 4, 2, 1


@attrs.frozen(kw_only=True)
class Identity:
    """The host user a call runs as; ``None`` uid means this process's own user (not root).

    ``per_turn``: the uid is leased for this turn alone (a root host), so the
    fix for a folder is never to hand it to that uid.
    """

    uid: int | None
    gid: int | None = None
    groups: frozenset[int] = frozenset()
    per_turn: bool = False

    def describe(self) -> str:
        """Name the identity for an error message."""
        if self.uid is None:
            return "you"
        if self.per_turn:
            return f"the turn's own user (host uid {self.uid}, one per turn)"
        return f"the sandbox's user (host uid {self.uid})"


def _bits(info: os.stat_result, who: Identity) -> int:
    if info.st_uid == who.uid:
        return (info.st_mode >> 6) & 7
    if info.st_gid == who.gid or info.st_gid in who.groups:
        return (info.st_mode >> 3) & 7
    return info.st_mode & 7


def mode_refusal(info: os.stat_result, who: Identity, *, writable: bool) -> str | None:
    """What ``who`` lacks to use a mounted path with ``info``: ``"read"``, ``"write"``..., or None.

    A folder needs read and search (and write if ``writable``), a file read
    (and write). Only the mounted path counts: inside the sandbox it hangs
    from the sandbox's own folders, so the host's parents are never walked.
    """
    is_dir = stat.S_ISDIR(info.st_mode)
    needed = (_READ | _SEARCH if is_dir else _READ) | (_WRITE if writable else 0)
    missing = needed & ~_bits(info, who)
    if not missing:
        return None
    words = (("read", _READ), ("write", _WRITE), ("enter", _SEARCH))
    return " or ".join(word for word, bit in words if missing & bit)


def _fix(path: str, who: Identity, writable: bool, info: os.stat_result) -> str:
    if who.uid is None:
        return f"make it yours to use (chmod u+rwx {path}) or mount another folder"
    folder = stat.S_ISDIR(info.st_mode)
    kind = ("rwx" if writable else "rx") if folder else ("rw" if writable else "r")
    if writable and who.per_turn:
        # Each turn is another uid: only "other" bits reach them all. The sticky bit keeps
        # one turn from removing another's files; set-gid shares them with the folder's group.
        return (
            f"let every turn write it (chmod 1777 {path}; add g+s to share what turns write "
            "with the folder's group), or mount a folder that is"
        )
    if writable:
        return (
            f"give it to that user (chown {who.uid}:{who.gid} {path}) or let others "
            f"write it (chmod o+{kind} {path}), or mount a folder that is"
        )
    mode = stat.S_IMODE(info.st_mode)
    return f"let others read it (chmod o+{kind} {path}, now {mode:04o}), or mount a folder that is"


#: At most this many entries of the agent folder are checked (an agent folder is small).
AGENT_WALK_LIMIT = 2000


def _agent_entries(root: str) -> list[str]:
    """The agent folder and what is in it, parents first: every file a tool may run or read."""
    found = [root]
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in (*sorted(dirs), *sorted(files)):
            if len(found) >= AGENT_WALK_LIMIT:
                return found
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                found.append(path)
    return found


def refusals(policy: Policy, who: Identity) -> list[str]:
    """One message per mounted host path (and agent folder entry) ``who`` cannot use."""
    wanted = [(str(m.source), str(m.target), m.writable) for m in policy.mounts]
    if policy.agent_dir is not None:
        # The agent's tools run from it: a file written under umask 077 fails as surely as
        # the folder itself.
        entries = _agent_entries(str(policy.agent_dir))
        wanted[:0] = [(entry, str(AGENT_DIR), False) for entry in entries]
    found: list[str] = []
    for path, target, writable in wanted:
        try:
            info = os.stat(path)
        except OSError as exc:
            found.append(f"{target}: cannot inspect host path {path}: {exc.strerror}")
            continue
        if who.uid is None:
            mode = (os.R_OK | os.X_OK if stat.S_ISDIR(info.st_mode) else os.R_OK) | (
                os.W_OK if writable else 0
            )
            missing = None if os.access(path, mode) else ("read or write" if writable else "read")
        else:
            missing = mode_refusal(info, who, writable=writable)
        if missing is not None:
            found.append(
                f"{target}: {who.describe()} cannot {missing} host path {path}; "
                f"{_fix(path, who, writable, info)}"
            )
    return found


def check_reach(backend: str, policy: Policy, who: Identity) -> None:
    """Raise ``UsageError`` listing every mounted host path the calls could not use."""
    problems = refusals(policy, who)
    if len(problems) > 10:
        problems = [*problems[:10], f"... and {len(problems) - 10} more"]
    if problems:
        raise UsageError(
            f"{backend}: the turn's calls could not use what it mounts:\n"
            + "\n".join(f"  {p}" for p in problems)
        )
