"""A ``docker-exec`` turn's own ``/etc/passwd`` and ``/etc/group``: its leased uid is ``nobody``.

Without the sandbox server no user namespace maps a call's ids, so a call is the
turn's leased host uid itself, which no image names: ``whoami`` and ``id -un``
failed, and a tool asking for its home found none. So each turn's container
binds, read-only, a passwd and a group file written for it before it is created:
the same two users the other backends' calls see (``_etc.SYNTHETIC``), with
``nobody`` (and ``nogroup``) at the turn's uid and the workspace as its home.

The files are the turn's alone (one container per turn, its uid fixed at
create), so nothing is rewritten while calls run and turns never race over one
file; the image's own ``/etc/passwd`` is never written (its root is read-only).
``identity_files`` is pure; ``write_identity`` is the only part with I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..._ground._leftovers import make_folder
from .._policy import WORKSPACE_DIR

__all__ = ["IDENTITY_FILES", "identity_binds", "identity_files", "write_identity"]

#: The files written per turn, each bound over the image's of the same name in /etc.
IDENTITY_FILES = ("passwd", "group")


def identity_files(uid: int) -> Mapping[str, str]:
    """The passwd and group of a turn whose calls are host ``uid`` (and gid): root, and
    ``nobody``/``nogroup`` at ``uid`` with the workspace as home, as the other backends'."""
    return {
        "passwd": (
            f"root:x:0:0:root:{WORKSPACE_DIR}:/bin/sh\n"
            f"nobody:x:{uid}:{uid}:nobody:{WORKSPACE_DIR}:/bin/sh\n"
        ),
        "group": f"root:x:0:\nnogroup:x:{uid}:\n",
    }


def identity_binds(folder: str) -> list[str]:
    """The engine's binds of ``folder``'s files over the image's, read-only."""
    return [f"{folder}/{name}:/etc/{name}:ro" for name in IDENTITY_FILES]


def write_identity(uid: int) -> str:
    """Write a new folder of the turn's files (world-readable); return its path.

    The folder is named for this process, so a host killed before it removed one
    leaves it to the next host's first (``_leftovers``). Raises ``OSError``.
    """
    folder = make_folder("docker-exec-etc")
    for name, text in identity_files(uid).items():
        path = os.path.join(folder, name)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, 0o644)
    return folder
