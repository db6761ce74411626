"""The bubblewrap backend: its command line as a value, its probe and its fail-closed start."""

from __future__ import annotations

import itertools
from pathlib import Path, PurePosixPath

import pytest

from astralvessel.errors import BackendUnavailableError, PromiseNotEnforcedError
from astralvessel.sandbox import Limits, Mount, Policy, Promise
from astralvessel.sandbox._bwrap import Bubblewrap, bwrap_argv
from astralvessel.sandbox._hostinfo import BinaryInfo, HostFacts, PythonRuntime, SystemDir

FULL = frozenset(
    {"size", "perms", "seccomp", "remount-ro", "unshare-cgroup-try", "die-with-parent"}
)
BWRAP = BinaryInfo(path="/opt/bwrap", origin="wheel", version="0.11.0", features=FULL)
ROOT = HostFacts(
    uid=0,
    machine="x86_64",
    userns=True,
    system_dirs=(
        SystemDir(path=PurePosixPath("/usr")),
        SystemDir(path=PurePosixPath("/bin"), symlink="usr/bin"),
    ),
    python=PythonRuntime(executable="/opt/py/bin/python3.11", prefix="/opt/py"),
)


def _pairs(argv: list[str], option: str) -> list[tuple[str, ...]]:
    width = {"--ro-bind": 2, "--bind": 2, "--symlink": 2}.get(option, 1)
    return [tuple(argv[i + 1 : i + 1 + width]) for i, arg in enumerate(argv) if arg == option]


def test_root_host_uses_no_user_namespace(tmp_path):
    """As root, bwrap makes every namespace but the user one, so calls can drop to a real host uid."""
    argv = bwrap_argv(BWRAP, Policy(), ROOT, ["python3"], seccomp_fd=5)
    assert "--unshare-user" not in argv
    for flag in (
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
    ):
        assert flag in argv
    assert argv[-2:] == ["--", "python3"]
    assert argv[argv.index("--seccomp") + 1] == "5"


def test_non_root_host_uses_a_user_namespace():
    """Without root, bwrap creates a user namespace with the server as its uid 0."""
    argv = bwrap_argv(
        BWRAP,
        Policy(),
        HostFacts(uid=1000, machine="x86_64", userns=True, python=ROOT.python),
        ["x"],
        seccomp_fd=None,
    )
    assert "--unshare-user" in argv
    assert "--seccomp" not in argv


def test_system_dirs_interpreter_agent_and_mounts_bound(tmp_path):
    """System dirs and the interpreter are read-only; a data mount is writable only when asked."""
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    policy = Policy(
        agent_dir=tmp_path,
        workdir="/data",
        mounts=(Mount.from_pair("/data", ro), Mount.from_pair("/out", rw, writable=True)),
    )
    argv = bwrap_argv(BWRAP, policy, ROOT, ["x"], seccomp_fd=None)
    assert ("/usr", "/usr") in _pairs(argv, "--ro-bind")
    assert ("/opt/py", "/opt/py") in _pairs(argv, "--ro-bind")
    assert (str(tmp_path), "/agent") in _pairs(argv, "--ro-bind")
    assert (str(ro), "/data") in _pairs(argv, "--ro-bind")
    assert _pairs(argv, "--bind") == [(str(rw), "/out")]
    assert ("usr/bin", "/bin") in _pairs(argv, "--symlink")


def test_folders_above_a_mount_are_made_0755_once_and_not_inside_a_mount(tmp_path):
    """bwrap would make a mount point's missing parents 0700: each is made 0755 first, once."""
    policy = Policy(
        mounts=(
            Mount.from_pair("/srv/deep/data", tmp_path),
            Mount.from_pair("/srv/deep/more", tmp_path),
            Mount.from_pair("/srv/deep/data/inner/x", tmp_path),
        )
    )
    argv = bwrap_argv(BWRAP, policy, ROOT, ["x"], seccomp_fd=None)
    made = [argv[i + 1] for i, option in enumerate(argv) if option == "--dir"]
    assert [path for path in made if path.startswith("/srv")] == ["/srv", "/srv/deep"]
    for path in made:
        at = argv.index(path)
        assert argv[at - 3 : at] == ["--perms", "0755", "--dir"]
    # Each parent is made before the bind that needs it; none inside the /usr bind.
    bind = next(i for i, arg in enumerate(argv) if arg == "/srv/deep/data")
    assert argv.index("/srv/deep") < bind
    assert not any(path.startswith("/usr/") for path in made)


def test_workspace_is_a_sized_tmpfs():
    """The workspace is a tmpfs of exactly the disk limit; the root and /dev are read-only."""
    argv = bwrap_argv(BWRAP, Policy(limits=Limits(disk_mb=64)), ROOT, ["x"], seccomp_fd=None)
    at = next(i for i, arg in enumerate(argv) if arg == "--tmpfs" and argv[i + 1] == "/workspace")
    assert argv[at - 2 : at] == ["--size", str(64 * 1024 * 1024)]
    remounted = [argv[i + 1] for i, option in enumerate(argv) if option == "--remount-ro"]
    assert remounted == ["/dev", "/"]


def test_dev_is_minimal_and_read_only():
    """/dev is a small read-only tmpfs with the harmless devices only: no --dev, no ptmx or pts."""
    argv = bwrap_argv(BWRAP, Policy(), ROOT, ["x"], seccomp_fd=None)
    assert "--dev" not in argv
    assert [pair[0] for pair in _pairs(argv, "--dev-bind")] == [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
    ]
    assert ("/proc/self/fd", "/dev/fd") in _pairs(argv, "--symlink")
    assert ("--remount-ro", "/dev") in itertools.pairwise(argv)


def test_etc_is_synthetic_with_named_host_entries():
    """The host's /etc is not bound: the synthetic files and the listed host entries are, read-only."""
    facts = HostFacts(
        uid=0,
        machine="x86_64",
        userns=True,
        system_dirs=(*ROOT.system_dirs, SystemDir(path=PurePosixPath("/etc"))),
        python=ROOT.python,
        etc_entries=("/etc/ssl/certs", "/etc/ld.so.cache"),
        runtime_dir="/run/av",
    )
    argv = bwrap_argv(BWRAP, Policy(), facts, ["x"], seccomp_fd=None)
    binds = {target: source for source, target in _pairs(argv, "--ro-bind")}
    assert "/etc" not in binds
    assert binds["/etc/ssl/certs"] == "/etc/ssl/certs"
    assert binds["/etc/passwd"].startswith("/run/av/etc-")
    for name in ("hostname", "hosts", "group", "resolv.conf", "nsswitch.conf", "machine-id"):
        assert f"/etc/{name}" in binds
    dirs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dir"]
    assert dirs[:2] == ["/etc", "/etc/ssl"]


def test_unmounted_workdir_is_created_empty():
    """A workdir no mount covers still exists (empty) so calls can start in it."""
    argv = bwrap_argv(BWRAP, Policy(workdir="/data"), ROOT, ["x"], seccomp_fd=None)
    assert ("/data",) in _pairs(argv, "--dir")


def test_old_bwrap_without_size_fails_closed_on_disk_limit():
    """A bwrap that cannot size its tmpfs makes start refuse with the disk-limit promise named."""
    backend = Bubblewrap()
    old = BinaryInfo(
        path=BWRAP.path, origin="system", version="0.4.0", features=frozenset({"seccomp"})
    )
    missing = backend._backend_unenforced(old, ROOT)
    assert Promise.DISK_LIMIT in missing
    assert "--size" in missing[Promise.DISK_LIMIT]


def test_missing_binary_is_unavailable(tmp_path):
    """A bwrap path that does not exist makes the backend unavailable with an install hint."""
    backend = Bubblewrap(tmp_path / "no-bwrap")
    report = backend.probe()
    assert not report.available
    with pytest.raises(BackendUnavailableError):
        backend.start(Policy())


def test_probe_reports_every_promise_enforced_here():
    """On this host (root, bwrap with --size), bubblewrap starts and keeps every promise."""
    report = Bubblewrap().probe()
    assert report.available, report.reason
    assert report.unenforced == {}
    assert report.enforced == frozenset(Promise)
    assert "bwrap" in report.details["binary"]


def test_unenforced_promise_refuses_start(monkeypatch):
    """A promise the backend cannot keep makes start raise PromiseNotEnforcedError naming it."""
    backend = Bubblewrap()
    monkeypatch.setattr(
        backend, "_backend_unenforced", lambda binary, facts: {Promise.DISK_LIMIT: "no --size"}
    )
    with pytest.raises(PromiseNotEnforcedError, match="disk-limit"):
        backend.start(Policy())


def test_relaxed_promise_lets_start_proceed(monkeypatch):
    """The host can relax a promise explicitly, and the turn then starts."""
    backend = Bubblewrap()
    monkeypatch.setattr(
        backend, "_backend_unenforced", lambda binary, facts: {Promise.DISK_LIMIT: "no --size"}
    )
    session = backend.start(Policy().relax(Promise.DISK_LIMIT))
    try:
        assert session.backend == "bubblewrap"
    finally:
        session.close()


def test_system_bwrap_works_too():
    """Debian's own /usr/bin/bwrap, when present, runs a turn as well as the wheel's."""
    system = Path("/usr/bin/bwrap")
    assert system.exists(), "CI installs the system bubblewrap too"
    session = Bubblewrap(system).start(Policy())
    try:
        from astralvessel.sandbox import RunRequest

        outcome = session.run(RunRequest(argv=("id", "-u"), timeout=10, output_chars=100))
    finally:
        session.close()
    assert outcome.output.strip() == "65534"


def test_writable_root_adds_the_root_dirs_and_keeps_the_root_read_only():
    """A writable root adds empty /opt, /var, ... for the server to cover; / itself stays ro."""
    plain = bwrap_argv(BWRAP, Policy(), ROOT, ["x"], seccomp_fd=None)
    argv = bwrap_argv(BWRAP, Policy(writable_root=True), ROOT, ["x"], seccomp_fd=None)
    added = [argv[i + 1] for i, option in enumerate(argv) if option == "--dir"]
    assert {"/opt", "/var", "/srv", "/home", "/mnt", "/root", "/tmp"} <= set(added)
    # (/opt is made in both: the interpreter is bound at /opt/py here.)
    assert "/srv" not in [plain[i + 1] for i, option in enumerate(plain) if option == "--dir"]
    assert [argv[i + 1] for i, option in enumerate(argv) if option == "--remount-ro"][-1] == "/"


def test_eval_relaxations_change_the_policy_identity():
    """writable_root and root_identity are in the policy's JSON, so each changes its identity."""
    ids = {
        Policy(writable_root=w, root_identity=r).identity
        for w, r in itertools.product([False, True], repeat=2)
    }
    assert len(ids) == 4
    assert Policy(writable_root=True).to_json()["writable_root"] is True
    with pytest.raises(TypeError):
        Policy(root_identity="yes")  # type: ignore[arg-type]
