"""Which mechanism opens a turn from a snapshot on each backend, and why (``doctor`` says it).

A pure decision by backend name. Every backend with a sandbox server copies:
the file worker makes the snapshot's files in the turn's own workspace tmpfs,
as the calls' user. Copy-on-write (an overlay whose lower layer is the
snapshot's tree on the host) is not used yet: the tree belongs to the host's
uid, a turn's calls to their own leased identity, and an overlay's copy-up
keeps the lower file's owner, so a call could not write the files it was
restored with; an idmapped lower layer would fix that but needs
``CAP_SYS_ADMIN`` over the host filesystem, which only a root host's server
could hold.
"""

from __future__ import annotations

__all__ = ["MECHANISMS", "snapshot_mechanism"]

_COPY = (
    "copy (the file worker writes the snapshot's files into the turn's workspace tmpfs, "
    "counted against disk_mb; no copy-on-write: see docs/snapshots.md)"
)
#: Per backend, how a turn opens from a snapshot.
MECHANISMS = {
    "bubblewrap": _COPY,
    "nsjail": _COPY,
    "docker": _COPY,
    "docker-exec": "none (no sandbox server: Turn.snapshot raises BackendUnavailableError)",
    "unconfined": _COPY,
}


def snapshot_mechanism(backend: str) -> str:
    """How ``backend`` opens a turn from a snapshot, in one line."""
    return MECHANISMS.get(backend, "unknown backend")
