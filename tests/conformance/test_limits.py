"""Promises: open files, file size, workspace size, memory and process count are all limited."""

from __future__ import annotations

import errno
import os
import textwrap

import attrs
import pytest

from astralvessel.results import with_memory_notes
from astralvessel.sandbox import ExecRequest, Sandbox

from .calls import PYTHON, py, py_json, run, wait_until_gone
from .conftest import DECLARED_UNKEPT, TEST_LIMITS

MIB = 1024 * 1024
#: How long the memory tests' children hold what they took: far longer than the watch (it
#: samples every 50 ms) needs to stop them even under load.
HOLD_S = 6
#: Their hold on a backend that declares the test's promise unkept (docker-exec has no memory
#: watch): nothing stops the children there, so the hold is only how long its expected failure
#: takes, and they still end on their own, the failure the declaration names. A backend that
#: comes to keep the promise passes as a strict XPASS; without its declaration it gets HOLD_S.
UNKEPT_HOLD_S = 0.5


def _hold_s(request: pytest.FixtureRequest, backend: Sandbox) -> float:
    """How long this memory test's children hold what they took, on ``backend``."""
    unkept = DECLARED_UNKEPT.get(backend.name, {})
    return UNKEPT_HOLD_S if request.node.originalname in unkept else HOLD_S


def test_open_files_limited(session):
    """A call cannot hold more than ``open_files`` descriptors; the next open fails with EMFILE."""
    result = py_json(
        session,
        """
        import json, os, resource
        fds = []
        try:
            while len(fds) < 10000:
                fds.append(os.open("/dev/null", os.O_RDONLY))
            err = None
        except OSError as exc:
            err = exc.errno
        print(json.dumps({"opened": len(fds), "errno": err, "limit": resource.getrlimit(resource.RLIMIT_NOFILE)}))
        """,
    )
    assert result["errno"] == errno.EMFILE
    assert result["opened"] < TEST_LIMITS.open_files
    assert result["limit"] == [TEST_LIMITS.open_files, TEST_LIMITS.open_files]


def test_file_larger_than_disk_limit_fails(session):
    """Writing one file past the disk limit fails with EFBIG, like a full disk, and the call goes on."""
    result = py_json(
        session,
        f"""
        import json
        written = 0
        try:
            with open("/workspace/big", "wb") as f:
                chunk = b"x" * (1024 * 1024)
                for _ in range({TEST_LIMITS.disk_mb + 4}):
                    f.write(chunk)
                    f.flush()
                    written += len(chunk)
            err = None
        except OSError as exc:
            err = exc.errno
        print(json.dumps({{"written": written, "errno": err}}))
        """,
    )
    assert result["errno"] in (errno.EFBIG, errno.ENOSPC)
    assert result["written"] <= TEST_LIMITS.disk_mb * MIB


def test_workspace_total_limited(session):
    """Many files together cannot exceed the disk limit: the workspace fills up with ENOSPC."""
    result = py_json(
        session,
        f"""
        import json, os
        total, err = 0, None
        try:
            for i in range({TEST_LIMITS.disk_mb} * 2):
                with open(f"/workspace/part{{i}}", "wb") as f:
                    f.write(b"y" * (1024 * 1024))
                total += 1024 * 1024
        except OSError as exc:
            err = exc.errno
        st = os.statvfs("/workspace")
        print(json.dumps({{"total": total, "errno": err, "size": st.f_blocks * st.f_frsize}}))
        """,
    )
    assert result["errno"] == errno.ENOSPC
    assert result["total"] <= TEST_LIMITS.disk_mb * MIB
    assert result["size"] <= TEST_LIMITS.disk_mb * MIB


def test_workspace_full_persists_across_calls(session):
    """The limit is the turn's, not one call's: a second call cannot add past what the first left."""
    first = run(
        session,
        "/bin/sh",
        "-c",
        f"head -c {(TEST_LIMITS.disk_mb - 2) * MIB} /dev/zero > /workspace/a",
    )
    assert first.exit_code == 0, first.output
    second = run(session, "/bin/sh", "-c", f"head -c {4 * MIB} /dev/zero > /workspace/b")
    assert second.exit_code != 0


def test_memory_limited(session):
    """Allocating more than ``memory_mb`` fails inside the call (MemoryError), not on the host."""
    outcome = py(
        session,
        f"""
        try:
            block = bytearray({TEST_LIMITS.memory_mb * 2} * 1024 * 1024)
            print("allocated", len(block))
        except MemoryError:
            print("MemoryError")
        """,
    )
    assert "MemoryError" in outcome.output
    assert "allocated" not in outcome.output


def test_process_count_limited(session):
    """A call cannot run more than ``processes`` processes: fork fails with EAGAIN."""
    result = py_json(
        session,
        f"""
        import json, os, time
        children, err = [], None
        try:
            for _ in range({TEST_LIMITS.processes} * 2):
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                children.append(pid)
        except OSError as exc:
            err = exc.errno
        print(json.dumps({{"forked": len(children), "errno": err}}))
        """,
    )
    assert result["errno"] == errno.EAGAIN
    assert result["forked"] < TEST_LIMITS.processes


@pytest.mark.slow
def test_fork_bomb_ends_the_call_cleanly(session):
    """A fork bomb is held to the process limit, ends at the timeout, and leaves nothing behind."""
    marker = f"vessel-bomb-{os.urandom(4).hex()}"
    outcome = run(
        session,
        "/bin/bash",
        "-c",
        f"bomb() {{ bomb | bomb & }}; bomb; wait # {marker}",
        timeout=3.0,
    )
    assert outcome.timed_out or outcome.exit_code is not None
    # The turn still works, and no process of the bomb survived on the host.
    assert run(session, "echo", "calm").output.strip() == "calm"
    assert wait_until_gone(marker) == []


def test_inode_count_limited(session):
    """Empty files past the workspace's inode bound fail with ENOSPC; the turn goes on after."""
    bound = TEST_LIMITS.workspace_inodes
    result = py_json(
        session,
        f"""
        import errno, json, os
        os.mkdir("/workspace/many")
        made, err = 0, None
        try:
            while made < {bound} + 100:
                os.close(os.open(f"/workspace/many/{{made}}", os.O_CREAT | os.O_WRONLY, 0o600))
                made += 1
        except OSError as exc:
            err = exc.errno
        st = os.statvfs("/workspace")
        print(json.dumps({{"made": made, "errno": err, "files": st.f_files}}))
        """,
        timeout=120.0,
    )
    assert result["errno"] == errno.ENOSPC
    assert result["made"] < bound
    assert 0 < result["files"] <= bound
    # Removing them gives the room back: the next call of the same turn writes again.
    after = run(
        session,
        "/bin/sh",
        "-c",
        "rm -rf /workspace/many && echo x > /workspace/f && cat /workspace/f",
    )
    assert after.exit_code == 0, after.output
    assert after.output.strip() == "x"


def test_memory_limit_holds_for_the_whole_turn(backend, policy, request):
    """Children each under the memory limit but together over it are stopped, with a note."""
    # A large disk limit puts any memory cgroup (memory + disk + 128 MiB) far above what the
    # children hold, so only the turn-wide memory limit itself can stop them.
    limits = attrs.evolve(TEST_LIMITS, disk_mb=512)
    session = backend.start(attrs.evolve(policy, limits=limits))
    try:
        _stopped_together(session, limits.memory_mb, _hold_s(request, backend))
    finally:
        session.close()


def test_an_exec_the_memory_limit_stops_says_so(backend, policy, request):
    """An exec whose children together pass the limit is stopped, its stderr saying why."""
    limits = attrs.evolve(TEST_LIMITS, disk_mb=512)
    session = backend.start(attrs.evolve(policy, limits=limits))
    try:
        request = ExecRequest(
            argv=(PYTHON, "-c", _together(limits.memory_mb, _hold_s(request, backend))),
            timeout=40.0,
            output_bytes=100_000,
        )
        result = session.exec(request)
        assert not result.timed_out
        assert result.returncode == -9
        assert b"every child ended on its own" not in result.stdout
        assert [stop.by for stop in result.memory] == ["watch"], result
        # The stderr the turn returns: the session's, then the notes on these facts.
        stderr = with_memory_notes(result).stderr.decode()
        assert stderr.startswith("[memory limit: the turn's calls held "), stderr
        assert f"more than the {limits.memory_mb} MiB limit" in stderr
        assert "this call's processes were stopped]\n" in stderr
        after = run(session, PYTHON, "-c", "print('ok')")
        assert after.output == "ok\n", after.output
    finally:
        session.close()


def _together(memory_mb, hold_s):
    """Python code whose five children of 0.3 times ``memory_mb`` each hold 1.5 times it,
    for ``hold_s`` once each has taken its share."""
    children = 5
    each = memory_mb * 3 // (children * 2)
    return textwrap.dedent(
        f"""
        import os, time
        for _ in range({children}):
            if os.fork() == 0:
                held = []
                for _ in range({each} // 8):
                    held.append(bytearray(8 * 1024 * 1024))
                    time.sleep(0.02)
                time.sleep({hold_s})
                os._exit(0)
        os.wait()
        print("every child ended on its own")
        """
    )


def _stopped_together(session, memory_mb, hold_s):
    """Five children of 0.3 times the limit each are stopped by the turn-wide limit; the turn goes on."""
    outcome = py(session, _together(memory_mb, hold_s), timeout=40.0)
    assert not outcome.timed_out
    assert outcome.exit_code is None
    assert "every child ended on its own" not in outcome.output
    assert "[memory limit:" in outcome.output
    assert f"more than the {memory_mb} MiB limit" in outcome.output
    # The turn goes on: the next call runs, and has the whole limit again.
    after = py(session, f"block = bytearray({memory_mb // 2} << 20); print('ok')")
    assert after.exit_code == 0, after.output
    assert after.output.strip() == "ok"


#: Children that each fill pipes until they hold ``each_mb`` MiB or run out of descriptors,
#: then keep them: kernel memory no process's RSS or PSS shows.
_FILL_PIPES = """
import fcntl, os, sys, time
children, each = int(sys.argv[1]), int(sys.argv[2]) << 20
for _ in range(children):
    if os.fork() == 0:
        held, chunk = 0, b"x" * 65536
        try:
            while held < each:
                r, w = os.pipe()
                fcntl.fcntl(w, fcntl.F_SETFL, os.O_NONBLOCK)
                try:
                    while True:
                        held += os.write(w, chunk)
                except BlockingIOError:
                    pass
        except OSError:
            pass
        time.sleep(float(sys.argv[3]))
        os._exit(0)
for _ in range(children):
    os.wait()
print("every child ended on its own")
"""


def test_pipe_buffers_count_against_the_turns_memory(backend, policy, request):
    """A call whose processes fill pipes past ``memory_mb`` is stopped with the memory note."""
    # 8 children of up to 16 MiB of pipes each: twice the limit, under any memory group.
    limits = attrs.evolve(TEST_LIMITS, memory_mb=64, open_files=4096)
    session = backend.start(attrs.evolve(policy, limits=limits))
    try:
        hold = str(_hold_s(request, backend))
        outcome = run(session, "/usr/bin/python3", "-c", _FILL_PIPES, "8", "16", hold, timeout=60.0)
        assert not outcome.timed_out, outcome.output
        assert outcome.exit_code is None, outcome.output
        assert "every child ended on its own" not in outcome.output
        assert "[memory limit: the turn's calls held" in outcome.output, outcome.output
        assert "more than the 64 MiB limit" in outcome.output
        # The turn goes on, its pipes gone with the call.
        after = run(session, "/bin/echo", "after")
        assert (after.exit_code, after.output) == (0, "after\n")
    finally:
        session.close()


def test_memory_a_fork_shares_counts_once(session):
    """A parent's memory shared copy-on-write with its children is not counted once per child."""
    held = TEST_LIMITS.memory_mb * 6 // 10
    outcome = py(
        session,
        f"""
        import os, time
        block = bytearray({held} << 20)
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                time.sleep(1)
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        print("all done")
        """,
        timeout=30.0,
    )
    assert outcome.exit_code == 0, outcome.output
    assert outcome.output.strip() == "all done"


#: Children that make themselves not dumpable, then each fill memfds and pipes until they hold
#: ``each_mb`` MiB, and keep them: a not-dumpable process's ``/proc/PID/fd`` is closed to a
#: server that is not real root. ``prctl`` hides each child with ``PR_SET_DUMPABLE``; ``exec``
#: started the whole script from a copy of the interpreter it may run but not read.
_HIDE_AND_FILL = """
import ctypes, fcntl, os, sys, time
children, each, how, hold = int(sys.argv[1]), int(sys.argv[2]) << 20, sys.argv[3], sys.argv[4]
prctl = ctypes.CDLL(None, use_errno=True).prctl
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
for _ in range(children):
    if os.fork() == 0:
        if how == "prctl":
            prctl(PR_SET_DUMPABLE, 0)
        print("dumpable" if prctl(PR_GET_DUMPABLE) else "not dumpable", flush=True)
        memfd, held, chunk = os.memfd_create("hidden"), 0, b"x" * 65536
        while held < each // 2:  # in small writes: the process's own memory stays small
            held += os.write(memfd, chunk)
        try:
            while held < each:
                r, w = os.pipe()
                fcntl.fcntl(w, fcntl.F_SETFL, os.O_NONBLOCK)
                try:
                    while True:
                        held += os.write(w, chunk)
                except BlockingIOError:
                    pass
        except OSError:
            pass
        time.sleep(float(hold))
        os._exit(0)
for _ in range(children):
    os.wait()
print("every child ended on its own")
"""
#: Copies the interpreter to the workspace as mode 0111 and runs ``_HIDE_AND_FILL`` with it:
#: exec of a file the process cannot read leaves it not dumpable.
_FROM_AN_UNREADABLE_COPY = (
    'copy="$TMPDIR/python-unreadable" && cp "$(readlink -f /usr/bin/python3)" "$copy" '
    '&& chmod 0111 "$copy" && exec "$copy" -c "$0" "$@"'
)


@pytest.mark.parametrize("how", ["prctl", "exec"])
def test_a_call_cannot_hide_its_memory_from_the_watch(backend, policy, how, request):
    """Processes that make themselves not dumpable and then fill memfds and pipes past
    ``memory_mb`` are stopped with the memory note, as any call is."""
    # 4 children of 32 MiB each: twice the limit, under any memory group (disk for the copy);
    # their own memory (five interpreters, sharing pages) stays well under it.
    limits = attrs.evolve(TEST_LIMITS, memory_mb=64, open_files=4096, disk_mb=32)
    session = backend.start(attrs.evolve(policy, limits=limits))
    hold = str(_hold_s(request, backend))
    try:
        if how == "prctl":
            argv = ["/usr/bin/python3", "-c", _HIDE_AND_FILL, "4", "32", how, hold]
        else:
            argv = [
                *("/bin/sh", "-c", _FROM_AN_UNREADABLE_COPY, _HIDE_AND_FILL),
                *("4", "32", how, hold),
            ]
        outcome = run(session, *argv, timeout=60.0)
        assert not outcome.timed_out, outcome.output
        assert outcome.exit_code is None, outcome.output
        # The children did hide (else this tests nothing), and were stopped all the same.
        assert "not dumpable" in outcome.output
        assert "\ndumpable" not in "\n" + outcome.output, outcome.output
        assert "every child ended on its own" not in outcome.output
        assert "[memory limit:" in outcome.output, outcome.output
        after = run(session, "/bin/echo", "after")
        assert (after.exit_code, after.output) == (0, "after\n")
    finally:
        session.close()
