"""The server's turn-wide memory rule as a pure function, and the note the host renders."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os

from astralvessel.results import command_output, with_memory_notes
from astralvessel.sandbox._api import MemoryStop
from astralvessel.sandbox._session import ServerSession, _Pending
from astralvessel.sandbox.server._bounds import (
    _copied_descriptors,
    _descriptors,
    _pipe_bytes,
    _status,
    disk_full,
    group_limit,
    limit_reader,
    oom_counter,
    oom_kills,
    over_limit,
    processes_reached,
)
from astralvessel.sandbox.server._kernelmem import epoll_bytes

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
    outcome = ServerSession._outcome(item, 400 * MIB)
    assert outcome.exit_code is None
    assert outcome.memory == (MemoryStop(by="watch", held=300 * MIB, limit=256 * MIB),)
    assert command_output(outcome) == (
        "partial\n[memory limit: the turn's calls held 300 MiB, more than the 256 MiB limit; "
        "this call's processes were stopped]\n"
    )


def test_kernel_stop_becomes_a_note_the_model_reads():
    """An exit frame that counts OOM kills in the turn's memory group ends the output with why."""
    item = _Pending(kind="run")
    item.output += b"partial"
    item.exit = {"exit_code": -9, "oom_killed": 2}
    outcome = ServerSession._outcome(item, 400 * MIB)
    assert outcome.exit_code == -9
    assert outcome.memory == (MemoryStop(by="kernel", killed=2, limit=400 * MIB),)
    assert command_output(outcome) == (
        "partial\n[memory limit: the kernel stopped 2 of the turn's processes while this call "
        "ran; the turn held its whole 400 MiB (the calls' memory, the workspace's files and "
        "kernel buffers such as pipes); this call's processes were stopped]\n"
    )
    for unsure in (0, True, "2", None):
        item.exit = {"exit_code": 0, "oom_killed": unsure}
        assert ServerSession._outcome(item, 400 * MIB).memory == ()


def test_kernel_stop_states_the_limit_the_kernel_applied():
    """The note states the group's limit the server read when the call ended, not the host's."""
    item = _Pending(kind="run")
    item.exit = {"exit_code": None, "oom_killed": 1, "oom_limit": 97 * MIB}
    assert "the turn held its whole 97 MiB" in command_output(
        ServerSession._outcome(item, 400 * MIB)
    )
    for unread in (None, 0, True, "97"):
        item.exit = {"exit_code": None, "oom_killed": 1, "oom_limit": unread}
        assert "its whole 400 MiB" in command_output(ServerSession._outcome(item, 400 * MIB))


def test_exec_stderr_ends_with_the_memory_notes():
    """An exec the memory watch or the kernel stopped says so after its own stderr."""
    item = _Pending(kind="exec", output_bytes=1024)
    item.add_stream("stderr", b"own words")
    header = {"exit_code": None, "memory": [300 * MIB, 256 * MIB], "oom_killed": 2}
    result = ServerSession._exec_result(item, header, 400 * MIB)
    assert result.returncode == -9
    assert result.stderr == b"own words"
    assert with_memory_notes(result).stderr == (
        b"own words\n[memory limit: the turn's calls held 300 MiB, more than the 256 MiB limit; "
        b"this call's processes were stopped]\n[memory limit: the kernel stopped 2 of the "
        b"turn's processes while this call ran; the turn held its whole 400 MiB (the calls' "
        b"memory, the workspace's files and kernel buffers such as pipes); this call's "
        b"processes were stopped]\n"
    )
    clean = ServerSession._exec_result(item, {"exit_code": 0, "oom_killed": 0}, 400 * MIB)
    assert clean.stderr == b"own words"


def test_a_call_whose_tasks_reach_its_nproc_limit_met_its_process_bound():
    """Init counts too (its limit is ``processes`` plus itself): at ``processes + 1`` tasks
    the kernel refuses the call's next fork; one below, it does not."""
    assert processes_reached({1: 48, 2: 49, 3: 60}, 48) == {2: [48, 48], 3: [59, 48]}
    assert processes_reached({}, 48) == {}


def test_disk_full_is_none_where_nothing_bounds_or_nothing_reads(tmp_path):
    """No path, or a filesystem with no blocks at all (unbounded), is never full; a full
    workspace is produced for real in tests/conformance/test_outcomes.py."""
    assert disk_full(str(tmp_path / "missing")) is None
    assert disk_full("/proc") is None  # no blocks: not a bounded filesystem


def test_processes_and_disk_met_are_limit_without_a_note():
    """An exit frame naming the process or disk bound makes the result ``limit``; its text
    is the command's own (it saw the kernel's EAGAIN or ENOSPC), with no note added."""
    item = _Pending(kind="run")
    item.output += b"fork: Resource temporarily unavailable\n"
    for bound in ({"processes": [48, 48]}, {"disk": [16 * MIB, 16 * MIB]}):
        item.exit = {"exit_code": 1, **bound}
        outcome = ServerSession._outcome(item, 400 * MIB)
        assert outcome.stopped_by_limit
        assert outcome.output == "fork: Resource temporarily unavailable\n"
    for unsure in (None, [], [1], [1, 0], [True, 4], ["1", 4], 3):
        item.exit = {"exit_code": 1, "processes": unsure, "disk": unsure}
        assert not ServerSession._outcome(item, 400 * MIB).stopped_by_limit
    exec_item = _Pending(kind="exec", output_bytes=1024)
    header = {"exit_code": 1, "disk": [16 * MIB, 16 * MIB]}
    assert ServerSession._exec_result(exec_item, header, 400 * MIB).stopped_by_limit


def test_group_limits_are_read_from_v1_stat_and_v2_max(tmp_path):
    """The server reads v1's ``hierarchical_memory_limit`` and v2's ``memory.max``."""
    v1 = tmp_path / "memory.stat"
    v1.write_bytes(b"cache 0\nrss 4096\nhierarchical_memory_limit 101711872\ntotal_rss 4096\n")
    v2 = tmp_path / "memory.max"
    v2.write_bytes(b"67108864\n")
    unlimited = tmp_path / "unlimited.max"
    unlimited.write_bytes(b"max\n")
    huge = tmp_path / "unlimited.stat"
    huge.write_bytes(b"hierarchical_memory_limit 9223372036854771712\n")
    for path, limit in ((v1, 101711872), (v2, 64 * MIB), (unlimited, None), (huge, None)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert group_limit(fd) == limit
        finally:
            os.close(fd)
    fd = limit_reader([str(tmp_path / "missing"), str(unlimited), str(v2)])
    assert fd is not None
    try:
        assert group_limit(fd) == 64 * MIB
    finally:
        os.close(fd)
    assert limit_reader([str(unlimited)]) is None


def test_oom_counts_are_read_from_v1_and_v2_files(tmp_path):
    """The server reads ``oom_kill`` from v1's ``memory.oom_control`` and v2's ``memory.events``."""
    v1 = tmp_path / "memory.oom_control"
    v1.write_bytes(b"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    v2 = tmp_path / "memory.events"
    v2.write_bytes(b"low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    bare = tmp_path / "other"
    bare.write_bytes(b"nothing 1\n")
    for path, kills in ((v1, 3), (v2, 2), (bare, None)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert oom_kills(fd) == kills
        finally:
            os.close(fd)
    missing = str(tmp_path / "missing")
    fd = oom_counter([missing, str(bare), str(v2), str(v1)])
    assert fd is not None
    try:
        assert oom_kills(fd) == 2  # the first that opens and counts
    finally:
        os.close(fd)
    assert oom_counter([missing, str(bare)]) is None


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_a_pipe_counts_a_page_per_buffer_it_may_hold():
    """A pipe counts at most its slots and at most a page per byte held, plus two cached pages."""
    page = 4096
    pipes = [os.pipe(), os.pipe2(os.O_DIRECT), os.pipe()]
    try:
        full, packets, empty = pipes
        os.set_blocking(full[1], False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(full[1], b"x" * page)
        for _ in range(3):
            os.write(packets[1], b"x")  # packet mode: a page each, for one byte
        me = os.getpid()
        slots = fcntl.fcntl(full[1], 1032) // page  # F_GETPIPE_SZ
        assert _pipe_bytes(f"/proc/{me}/fd/{full[0]}") == page * (slots + 2)
        assert _pipe_bytes(f"/proc/{me}/fd/{packets[1]}") == page * (3 + 2)
        assert _pipe_bytes(f"/proc/{me}/fd/{empty[0]}") == page * 2
        # Both ends of a pipe are one pipe: counted once per sample.
        seen: set[object] = set()
        total = _descriptors(str(me), seen)
        # The three pipes above (slots + 2, 3 + 2, 2 pages); the process may hold others.
        assert total >= page * ((slots + 2) + (3 + 2) + 2)
        # A second pass finds every pipe seen; only epoll watches count again (an epoll is
        # charged per holder), and this process may hold an epoll (an event loop's).
        assert _descriptors(str(me), seen) == sum(
            epoll_bytes(f"/proc/{me}/fd/{fd}")
            for fd in os.listdir(f"/proc/{me}/fd")
            if _link(f"/proc/{me}/fd/{fd}") == "anon_inode:[eventpoll]"
        )
    finally:
        for pair in pipes:
            for fd in pair:
                os.close(fd)


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


def test_a_not_dumpable_process_s_descriptors_are_copied_in():
    """The copies through ``pidfd_getfd`` weigh what ``/proc/PID/fd`` shows, where allowed."""
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
            memfd = os.memfd_create("held")
            os.write(memfd, b"x" * (1 << 20))
            held = os.pipe()
            os.write(held[1], b"x" * 4096)
            os.write(ready_w, b"r")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"r"
        slots = _status(str(child))[3]
        copied = _copied_descriptors(str(child), slots, set())
        if os.geteuid() == 0:
            assert copied == _descriptors(str(child), set())
            assert copied is not None
            assert copied >= (1 << 20) + 3 * 4096  # the memfd, and the pipe's page and cache
        else:
            # Its memory belongs to the host's user namespace (it never ran exec in one of
            # ours), where an ordinary user holds nothing: the kernel refuses, and the watch
            # counts the process as hiding.
            assert _descriptors(str(child), set(), slots) is None
            assert copied is None
    finally:
        os.write(stop_w, b"s")
        os.waitpid(child, 0)
        for fd in (ready_r, ready_w, stop_r, stop_w):
            os.close(fd)
