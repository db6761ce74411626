"""Which mechanism opens a turn from a snapshot on each backend, and why (``doctor`` says it).

A pure table by backend name, and a probe of the host's kernel that the
doctor's line reads:

- **Copy-on-write** on bubblewrap and nsjail: the snapshot's tree in the
  host's store is bound read-only into the sandbox and the server lays an
  overlay on the workspace, the tree below, the turn's own layer (on its
  workspace tmpfs, counted against ``disk_mb``) above
  (``sandbox/server/_lowerfs``). As root the tree is root's and each turn's
  calls have a leased uid: the lower layer is an idmapped clone of the bind
  that shows the tree as theirs, since an overlay's copy-up keeps the lower
  file's owner. It needs overlays in a user namespace (Linux 5.11) as an
  ordinary user, and an overlay over an idmapped mount (5.19) as root.
- **A copy** everywhere else, and wherever the sandbox's server could not
  mount the overlay (it says why; the turn goes on with a copy): the file
  worker makes the snapshot's files in the turn's workspace tmpfs, as the
  calls' user.
- On **Docker** the container's server cannot lay it (its mounts are made in
  the container's user namespace, where the store's files map to no one, and
  an idmapped layer needs ``CAP_SYS_ADMIN`` in the host's): a root host lays
  the same overlay itself and binds it in as the workspace
  (``sandbox/docker/_cow``); an ordinary user's host copies.
"""

from __future__ import annotations

import os

__all__ = [
    "COPY_ON_WRITE",
    "MECHANISMS",
    "adopts_stack",
    "adopts_warm",
    "held_stacked_lower",
    "kernel_overlay_problem",
    "lower_by_descriptor",
    "overlay_backend",
    "snapshot_mechanism",
    "stacked_lower",
    "upper_layer_listed",
]

_COPY = (
    "copy (the file worker writes the snapshot's files into the turn's workspace tmpfs, "
    "counted against disk_mb)"
)
COPY_ON_WRITE = (
    "copy-on-write (an overlay: the snapshot's tree in the host's store, read-only and "
    "shared, below; the turn's writes in its workspace tmpfs, counted against disk_mb, "
    "above; idmapped to the turn's uid as root)"
)
#: Per backend, how a turn opens from a snapshot where the host allows it.
MECHANISMS = {
    "bubblewrap": COPY_ON_WRITE,
    "nsjail": COPY_ON_WRITE,
    "docker": COPY_ON_WRITE + "; mounted by the host and bound in as the workspace",
    "docker-exec": "none (no sandbox server: Turn.snapshot raises BackendUnavailableError)",
    "unconfined": _COPY,
}
#: The backends whose overlay the host mounts itself (``sandbox/docker/_cow``), which only
#: root can: an ordinary user's turns copy.
_MOUNTED_BY_THE_HOST = frozenset({"docker"})
#: The oldest kernel whose overlays serve: an ordinary user's (in a user namespace), and
#: root's (over an idmapped lower layer).
_KERNEL_FOR = {False: (5, 11), True: (5, 19)}


#: The backends whose launcher passes a held frozen layer's descriptor to the server
#: (``Policy.workspace_lower_fd``): a local process the host starts, or Docker's server
#: over its direct channel (passed with the hello; on the attach stream the files are copied).
_LOWER_BY_DESCRIPTOR = frozenset({"bubblewrap", "nsjail", "docker"})


#: The backends whose warm sandboxes a fork may adopt (``Policy.adoptable``): each is
#: handed a socket that a fork's frozen layer may come on later, at spawn (their channel
#: is pipes) or, on Docker, with the hello over the direct channel (``docker/_adoption``).
_ADOPTS_WARM = frozenset({"bubblewrap", "nsjail", "docker"})


def adopts_warm(backend: str) -> bool:
    """Whether a fork on ``backend`` may take a warm sandbox and lay its layer there."""
    return backend in _ADOPTS_WARM


#: The backends whose warm sandboxes take a stack of layers, top first: the server lays
#: its overlay on them all, or, Docker's as root, the host lays it and moves it onto the
#: container's workspace (``docker._adoption.lay_adoption``: root's layers' opaque folders
#: are ``trusted.*`` attributes, which an overlay laid in the container's own user
#: namespace would not read). An ordinary user's Docker host fits each layer to the
#: sandbox's uid (``ServerLink.fit_layer``), its layers' marks ``user.*`` ones.
_ADOPTS_STACK = frozenset({"bubblewrap", "nsjail", "docker"})


def adopts_stack(backend: str) -> bool:
    """Whether a fork of a fork on ``backend`` may take a warm sandbox and lay its stack
    there."""
    return backend in _ADOPTS_STACK


#: The backends whose server lays its overlay on a stack of layers bound apart
#: (``Policy.workspace_layers``): a fork of a fork's, frozen in place. Docker's host lays
#: it itself as root (``docker._cow``); an ordinary user's Docker forks of a fork capture.
_STACKED_LOWER = frozenset({"bubblewrap", "nsjail"})


def stacked_lower(backend: str, *, root: bool | None = None) -> bool:
    """Whether ``backend``'s turns open on a stack of frozen layers as such (else on its
    merged view, as on any tree). ``root``: whether the host is root (None: this process's)."""
    if backend in _STACKED_LOWER:
        return True
    return backend in _MOUNTED_BY_THE_HOST and (os.geteuid() == 0 if root is None else root)


#: The backends whose server lays its overlay on an ordinary user's stack of held layers
#: passed by descriptor (``Policy.workspace_below_fds``): bubblewrap's and nsjail's
#: inherited, Docker's passed with the hello over the direct channel, each made the fork's
#: by its reader (``docker._reader``; a fork on the attach stream has its files copied).
_HELD_STACKED_LOWER = frozenset({"bubblewrap", "nsjail", "docker"})


def held_stacked_lower(backend: str) -> bool:
    """Whether an ordinary user's turns on ``backend`` open on a stack of held frozen
    layers as such, and its forks of a fork freeze their own layer over them."""
    return backend in _HELD_STACKED_LOWER


def lower_by_descriptor(backend: str) -> bool:
    """Whether ``backend``'s turns open copy-on-write on a frozen layer the host holds as
    a descriptor (an ordinary user's); elsewhere its files are copied in."""
    return backend in _LOWER_BY_DESCRIPTOR


def overlay_backend(backend: str) -> bool:
    """Whether ``backend``'s turns open from a snapshot copy-on-write where the host allows."""
    return MECHANISMS.get(backend, "").startswith(COPY_ON_WRITE)


def upper_layer_listed(backend: str, *, root: bool | None = None) -> bool:
    """Whether a copy-on-write turn's snapshot reads only what its upper layer holds: the
    server keeps a descriptor of that layer for its file worker, or, where the host mounts
    the overlay (Docker), the host keeps one, which only root's host has (an ordinary
    user's copies). ``root``: whether the host is root (None: this process's)."""
    if not overlay_backend(backend):
        return False
    if backend not in _MOUNTED_BY_THE_HOST:
        return True
    return os.geteuid() == 0 if root is None else root


def kernel_overlay_problem(release: str, filesystems: str, *, root: bool) -> str | None:
    """Why this kernel cannot serve the overlay (None: it can), from its release string
    (``uname -r``) and ``/proc/filesystems``."""
    if "\toverlay\n" not in filesystems + "\n":
        return "the kernel has no overlay filesystem loaded"
    try:
        found = tuple(int(part) for part in release.split("-", maxsplit=1)[0].split(".")[:2])
    except ValueError:
        return f"the kernel's release {release!r} cannot be read"
    wanted = _KERNEL_FOR[root]
    if found < wanted:
        what = "over an idmapped lower layer" if root else "in a user namespace"
        return f"Linux {found[0]}.{found[1]} has no overlays {what} (5.{wanted[1]} has)"
    return None


def _host_problem() -> str | None:
    try:
        with open("/proc/filesystems", encoding="ascii", errors="replace") as handle:
            filesystems = handle.read()
    except OSError as exc:
        return f"/proc/filesystems cannot be read: {exc}"
    return kernel_overlay_problem(os.uname().release, filesystems, root=os.geteuid() == 0)


def snapshot_mechanism(backend: str) -> str:
    """How ``backend`` opens a turn from a snapshot on this host, in one line."""
    found = MECHANISMS.get(backend, "unknown backend")
    if not overlay_backend(backend):
        return found
    why = _host_problem()
    if backend in _MOUNTED_BY_THE_HOST and os.geteuid() != 0:
        why = "the host mounts this backend's overlay, and only root can"
    return found if why is None else f"{_COPY}; no copy-on-write here: {why}"
