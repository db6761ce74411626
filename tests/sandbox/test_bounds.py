"""The server's turn-wide memory rule as a pure function, and the note the host renders."""

from __future__ import annotations

from astralvessel.sandbox._session import ServerSession, _Pending
from astralvessel.sandbox.server._bounds import over_limit

MIB = 1 << 20


def test_over_limit_names_the_largest_call_only_past_the_limit():
    """Calls together at the limit go on; past it, the largest one (lowest id on a tie) stops."""
    assert over_limit({1: 100 * MIB, 2: 156 * MIB}, 256 * MIB) is None
    assert over_limit({1: 100 * MIB, 2: 157 * MIB}, 256 * MIB) == 2
    assert over_limit({4: 200 * MIB, 3: 200 * MIB}, 256 * MIB) == 3
    assert over_limit({}, 0) is None


def test_memory_stop_becomes_a_note_the_model_reads():
    """An exit frame that says the memory watch stopped the call ends the output with why."""
    item = _Pending(kind="run")
    item.output += b"partial"
    item.exit = {"exit_code": None, "memory": [300 * MIB, 256 * MIB]}
    outcome = ServerSession._outcome(item)
    assert outcome.exit_code is None
    assert outcome.output == (
        "partial\n[memory limit: the turn's calls held 300 MiB, more than the 256 MiB limit; "
        "this call's processes were stopped]\n"
    )


def test_mechanisms_follow_what_the_turn_has():
    """Each limit's mechanism names the cgroup only where there is one, the watch only with a server."""
    from astralvessel.sandbox._mechanisms import Setup, limit_mechanisms

    bare = limit_mechanisms(Setup(no_cgroup="not root"))
    assert bare["memory"] == (
        "the server's memory watch (all the turn's calls together, sampled every 50 ms); "
        "RLIMIT_AS per process (no memory cgroup: not root)"
    )
    assert bare["processes"] == "RLIMIT_NPROC per call, counted in the call's own user namespace"
    jail = limit_mechanisms(Setup(memory_cgroup="cgroup v1", pids_cgroup="cgroup v1"))
    assert jail["memory"].startswith("a cgroup v1 memory group for the turn")
    assert jail["processes"].startswith("a cgroup v1 pids group for the turn; ")
    execs = limit_mechanisms(
        Setup(memory_cgroup="cgroup v2", pids_cgroup="cgroup v2", server=False)
    )
    assert "memory watch" not in execs["memory"]
    assert "ulimit -p" in execs["processes"]


def test_bubblewrap_turn_runs_in_its_memory_cgroup_where_the_host_has_one():
    """As root on cgroup v1 each bubblewrap turn has a memory group of its own, removed at close."""
    from pathlib import Path

    from astralvessel.sandbox import Limits, Policy, RunRequest
    from astralvessel.sandbox._cgroup import PARENT, memory_mount, turn_memory_bytes
    from astralvessel.sandbox._discovery import get_backend
    from astralvessel.sandbox._hostinfo import collect_host_facts

    mount = memory_mount(collect_host_facts())
    limits = Limits(memory_mb=200, disk_mb=8)
    session = get_backend("bubblewrap").start(Policy(limits=limits))
    try:
        call = RunRequest(argv=("/bin/true",), timeout=10, output_chars=100)
        assert session.run(call).exit_code == 0
        bwrap = session.channel.process.pid  # type: ignore[attr-defined]
        lines = Path(f"/proc/{bwrap}/cgroup").read_text().splitlines()
        group = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory")
        limit = Path(f"{mount}{group}/memory.limit_in_bytes") if mount else None
        found = int(limit.read_text()) if limit is not None else None
    finally:
        session.close()
    # Without a v1 memory controller we may write to (not root), the turn has no group of ours.
    assert group.startswith(f"/{PARENT}/turn-") is (mount is not None)
    if limit is not None:
        assert found == turn_memory_bytes(limits)
        assert not limit.parent.exists()


def test_a_dead_hosts_turn_cgroups_are_removed_by_the_next_turn():
    """A turn's memory group left by a host process that was killed goes when the next turn starts."""
    import subprocess
    from pathlib import Path

    from astralvessel.sandbox import Limits
    from astralvessel.sandbox._cgroup import PARENT, memory_mount, turn_cgroup
    from astralvessel.sandbox._hostinfo import collect_host_facts

    mount = memory_mount(collect_host_facts())
    if mount is None:
        return  # not root on cgroup v1: no turn group is ever made, so none can be left
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    left = Path(mount, PARENT, f"turn-{dead.pid}-feedfacecafe")
    left.mkdir(parents=True)
    group = turn_cgroup(mount, Limits())
    try:
        assert not left.exists()
        assert Path(group.path).is_dir()
    finally:
        group.remove()
    assert not Path(group.path).exists()


def test_nsjail_groups_of_dead_turns_are_removed_by_the_next_turn():
    """nsjail leaves its cgroups when it is killed; the next nsjail turn removes them."""
    import os
    import signal
    import time
    from pathlib import Path

    from astralvessel.sandbox import Policy
    from astralvessel.sandbox._cgroup import _alive
    from astralvessel.sandbox._discovery import get_backend
    from astralvessel.sandbox._hostinfo import collect_host_facts
    from astralvessel.sandbox._nsjail import cgroup_plan

    plan = cgroup_plan(collect_host_facts())
    first = get_backend("nsjail").start(Policy())
    nsjail = first.channel.process.pid  # type: ignore[attr-defined]
    # nsjail names each group after the jailed child's host pid.
    jailed = Path(f"/proc/{nsjail}/task/{nsjail}/children").read_text().split()
    # A host that dies, or a close that finds nsjail stuck, kills it: it cleans up nothing.
    os.kill(nsjail, signal.SIGKILL)
    first.close()
    groups = (
        [
            Path(mount, plan.parent, f"NSJAIL.{jailed[0]}")
            for mount in (plan.memory_mount, plan.pids_mount)
        ]
        if plan
        else []
    )
    assert len(jailed) == 1
    # The kernel tears the jail's namespaces down after nsjail dies; wait until the groups are
    # empty and the jailed process has exited (a bounded wait, long for a loaded machine).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        _alive(int(jailed[0]))
        or any(g.exists() and (g / "cgroup.procs").read_text().strip() for g in groups)
    ):
        time.sleep(0.05)
    second = get_backend("nsjail").start(Policy())
    second.close()
    assert not [group for group in groups if group.exists()]
