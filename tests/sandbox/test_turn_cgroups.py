"""A turn's own cgroups as root on cgroup v1: kept while it lives, gone when it closes, silent."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from astralvessel.sandbox import Limits, Policy, RunRequest, SandboxSession
from astralvessel.sandbox._cgroup import PARENT, PREFIX, TurnCgroup, cgroup_mounts, turn_cgroup
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._hostinfo import collect_host_facts

#: Each backend and the controllers its turns get a group of.
CONTROLLERS = {"bubblewrap": ("memory",), "nsjail": ("memory", "pids")}
#: Another host process that sweeps the parents as fast as it can, as other hosts' turns do.
SWEEPER = """
import sys
from astralvessel.sandbox._cgroup import sweep_dead
while True:
    for parent in sys.argv[1:]:
        sweep_dead(parent)
"""


def _mounts(controllers: tuple[str, ...]) -> dict[str, str]:
    mounts = cgroup_mounts(collect_host_facts(), controllers)
    assert mounts is not None, "these tests need root on cgroup v1 with memory and pids mounted"
    return mounts


def _groups(pid: int, mounts: dict[str, str]) -> dict[str, Path]:
    """The group of ``pid`` under each controller of ``mounts``, as host paths."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    where = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in lines}
    return {name: Path(mount + where[name]) for name, mount in mounts.items()}


def _call(argv: list[str]) -> RunRequest:
    return RunRequest(argv=argv, timeout=60.0, output_chars=10000)


def _one_turn(name: str, mounts: dict[str, str]) -> tuple[list[Path], list[str], str]:
    """Open a turn, check its groups hold it across calls, close it; its groups, faults, stderr."""
    faults: list[str] = []
    session: SandboxSession = get_backend(name).start(Policy())
    try:
        tool = session.channel.process.pid  # type: ignore[attr-defined]
        groups = _groups(tool, mounts)
        for group in groups.values():
            if not group.name.startswith(f"{PREFIX}{os.getpid()}-"):
                faults.append(f"{group} is not a group of this host process")
        for argv in (["/bin/true"], ["/bin/sleep", "0.2"], ["/bin/echo", "done"]):
            outcome = session.run(_call(argv))
            if outcome.exit_code != 0:
                faults.append(f"{argv} ended {outcome.exit_code}: {outcome.output}")
            for group in groups.values():
                procs = (group / "cgroup.procs").read_text().split()
                if str(tool) not in procs:
                    faults.append(f"{group} lost the sandbox (holds {procs})")
    finally:
        session.close()
    tail = session.channel.stderr_tail()  # type: ignore[attr-defined]
    return list(groups.values()), faults, tail


@pytest.mark.parametrize("name", list(CONTROLLERS))
def test_turns_keep_their_groups_while_other_hosts_sweep(name: str) -> None:
    """24 turns open, call and close 12 at a time while another process sweeps: no group is lost or left."""
    mounts = _mounts(CONTROLLERS[name])
    parents = [Path(mount, PARENT) for mount in mounts.values()]
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    # What a killed host leaves (the sweeps must remove it), and a name no sweep may touch.
    planted = [parent / f"{PREFIX}{dead.pid}-0badcafe0bad" for parent in parents]
    foreign = [parent / f"{PREFIX}not-a-pid" for parent in parents]
    for group in planted + foreign:
        group.mkdir(parents=True, exist_ok=True)
    sweeper = subprocess.Popen([sys.executable, "-c", SWEEPER, *map(str, parents)])
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            seen = list(pool.map(lambda _: _one_turn(name, mounts), range(24)))
        swept = [group for group in planted if group.exists()]
    finally:
        sweeper.kill()
        sweeper.wait()
        kept = [group for group in foreign if group.exists()]
        for group in foreign:
            group.rmdir()
    assert not swept, "the sweeper never removed a dead host's groups"
    assert kept == foreign
    assert [faults for _, faults, _ in seen if faults] == []
    # nsjail printed "removeCgroup(): rmdir(...) failed" when a sweep won its race.
    assert [tail for _, _, tail in seen if tail.strip()] == []
    left = [group for groups, _, _ in seen for group in groups if group.exists()]
    assert left == []
    assert len({group for groups, _, _ in seen for group in groups}) == 24 * len(mounts)


@pytest.mark.parametrize("name", list(CONTROLLERS))
def test_a_killed_sandboxs_groups_are_gone_when_its_turn_closes(name: str) -> None:
    """A sandbox killed under its turn (a wedged tool, an OOM kill) leaves no group after close."""
    mounts = _mounts(CONTROLLERS[name])
    session = get_backend(name).start(Policy())
    try:
        tool = session.channel.process.pid  # type: ignore[attr-defined]
        groups = _groups(tool, mounts)
        assert session.run(_call(["/bin/true"])).exit_code == 0
        os.kill(tool, signal.SIGKILL)
    finally:
        session.close()
    assert [group for group in groups.values() if group.exists()] == []


def test_a_dead_hosts_groups_go_when_the_next_turn_starts() -> None:
    """Groups a killed host left, under every controller, are removed by the next turn's groups."""
    mounts = _mounts(("memory", "pids"))
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    left = [Path(mount, PARENT, f"{PREFIX}{dead.pid}-feedfacecafe") for mount in mounts.values()]
    for group in left:
        group.mkdir(parents=True)
    group = turn_cgroup(mounts, Limits())
    try:
        assert [path for path in left if path.exists()] == []
        assert all(Path(path).is_dir() for path in group.paths)
    finally:
        group.remove()
    assert [path for path in group.paths if Path(path).exists()] == []


def test_wrap_enters_every_group_before_the_command_runs() -> None:
    """The wrapped command is born in each of the turn's groups, with its argv untouched."""
    mounts = _mounts(("memory", "pids"))
    group = turn_cgroup(mounts, Limits())
    try:
        argv = group.wrap(["/bin/sh", "-c", 'cat /proc/self/cgroup; echo "$0|$1"', "a b", "$2"])
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
    finally:
        group.remove()
    *lines, echoed = done.stdout.splitlines()
    where = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in lines}
    assert {name: mount + where[name] for name, mount in mounts.items()} == dict(
        zip(mounts, group.paths, strict=True)
    )
    assert echoed == "a b|$2"
    # Through each group's tasks (the shell's one thread), never cgroup.procs: moving a
    # whole process takes a global lock that waits out an RCU grace period on every start.
    assert argv[3 : 3 + len(group.paths)] == [f"{path}/tasks" for path in group.paths]


@pytest.mark.parametrize("paths", [(), ("relative/group",), ["/a/list"], ("/ok", b"/bytes")])
def test_turn_cgroup_refuses_bad_paths(paths: object) -> None:
    """A turn's groups are a tuple of one or more absolute paths, on every construction path."""
    with pytest.raises(ValueError, match="turn's cgroup"):
        TurnCgroup(paths)  # type: ignore[arg-type]


def test_groups_older_nsjail_turns_left_are_swept_when_dead() -> None:
    """``NSJAIL.<pid>`` groups of older versions go once their pid is dead; a live or busy one stays."""
    mounts = _mounts(("memory", "pids"))
    dead, gone = subprocess.Popen(["/bin/true"]), subprocess.Popen(["/bin/true"])
    dead.wait()
    gone.wait()
    alive = subprocess.Popen(["/bin/sleep", "60"])
    try:
        left = [Path(mount, PARENT, f"NSJAIL.{dead.pid}") for mount in mounts.values()]
        live = [Path(mount, PARENT, f"NSJAIL.{alive.pid}") for mount in mounts.values()]
        busy = Path(mounts["pids"], PARENT, f"NSJAIL.{gone.pid}")
        for group in left + live + [busy]:
            group.mkdir(parents=True, exist_ok=True)
        # A group that still holds a process (the pid in its name gone) is not ours to empty.
        holder = subprocess.Popen(
            ["/bin/sh", "-c", 'echo 0 >"$0" && exec sleep 60', str(busy / "cgroup.procs")]
        )
        try:
            while not (busy / "cgroup.procs").read_text().split():
                assert holder.poll() is None, "the holder could not enter its group"
            group = turn_cgroup(mounts, Limits())
            group.remove()
            assert [path for path in left if path.exists()] == []
            assert [path for path in live if not path.exists()] == []
            assert busy.exists()
        finally:
            holder.kill()
            holder.wait()
    finally:
        alive.kill()
        alive.wait()
        for group in [*live, busy]:
            TurnCgroup((str(group),)).remove()


def test_a_turns_memory_group_bounds_its_tcp_buffers() -> None:
    """Where cgroup v1 has memory.kmem.tcp, a turn's group holds TCP buffers to memory_mb
    (v1 charges them to no group until a limit is set)."""
    mounts = _mounts(("memory",))
    assert collect_host_facts().cgroup_kmem_tcp, "this host's v1 memory controller has kmem.tcp"
    group = turn_cgroup(mounts, Limits(memory_mb=48))
    try:
        limit = Path(group.paths[0], "memory.kmem.tcp.limit_in_bytes").read_text()
    finally:
        group.remove()
    assert int(limit) == 48 << 20
