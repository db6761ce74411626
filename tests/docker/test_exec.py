"""The docker-exec backend on a real engine: one docker exec per call, and its hostile-input bounds."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import time

import attrs
import pytest

from astralvessel.errors import SandboxError
from astralvessel.results import SKIPPED_WORDS, command_output
from astralvessel.sandbox import Policy, Promise, RunRequest, get_backend
from astralvessel.sandbox._discovery import AUTOMATIC_ORDER
from astralvessel.sandbox._uids import DEFAULT_UID_RANGE
from astralvessel.sandbox.docker import DockerExec
from astralvessel.sandbox.docker._exec_session import (
    OUTBOX_MAX_FILES,
    OutboxEntry,
    OutputBuffer,
    parse_listing,
    plan_outbox,
)
from astralvessel.sandbox.docker._spec import EXEC_SETUP_FAILED, READY, exec_argv
from astralvessel.sandbox.server._outbox import NOT_PLAIN, NOT_UTF8, TOO_BIG, TOO_MANY
from tests.conformance.calls import file_tool

from .conftest import BASE_IMAGE, NOPYTHON_IMAGE, SMALL_LIMITS

#: A plain policy: choosing docker-exec by name is itself the explicit choice of its mode.
POLICY = Policy(limits=SMALL_LIMITS)


def _run(session, script: str, *, timeout: float = 30.0, output_chars: int = 20_000):
    request = RunRequest(argv=["/bin/sh", "-c", script], timeout=timeout, output_chars=output_chars)
    outcome = session.run(request)
    # The output as the model reads it: with the notes on what did not come back.
    return attrs.evolve(outcome, output=command_output(outcome))


@pytest.fixture
def exec_turn(docker_api):
    """A docker-exec turn on the image without Python."""
    session = DockerExec(image=NOPYTHON_IMAGE, pull=False).start(POLICY)
    try:
        yield session
    finally:
        session.close()


# -- the mode --------------------------------------------------------------------------


def test_found_by_name():
    """docker-exec is a backend name of its own, found the way a host finds any backend."""
    backend = get_backend("docker-exec")
    assert isinstance(backend, DockerExec)
    assert backend.name == "docker-exec"


def test_calls_see_the_policys_exact_environment(exec_turn):
    """Each call is a docker exec as the turn's leased uid with exactly the policy's env, stderr merged."""
    outcome = _run(exec_turn, "id -u; env | sort; echo to-stderr >&2; exit 3")
    assert outcome.exit_code == 3
    assert outcome.metadata["docker_mode"] == "exec-per-call"
    lines = outcome.output.splitlines()
    assert lines[0] == exec_turn._user.split(":")[0]
    assert DEFAULT_UID_RANGE.first <= int(lines[0]) <= DEFAULT_UID_RANGE.last
    names = {line.split("=", 1)[0] for line in lines[1:-1]}
    assert names - {"PWD"} == set(Policy().environment)
    assert lines[-1] == "to-stderr"


def test_file_tools_say_to_use_bash(exec_turn):
    """The file tools need the server; the model is told so and what to use instead."""
    outcome = file_tool(exec_turn, "read", {"path": "/etc/hostname"}, timeout=5)
    assert outcome.is_error
    assert "bash" in outcome.text


def test_kills_leftovers_and_times_out(exec_turn, docker_api):
    """A timed-out call is killed, and a background process does not outlive its call."""
    assert _run(exec_turn, "sleep 300 & echo started").output.strip() == "started"
    outcome = _run(exec_turn, "sleep 300", timeout=1.0)
    assert outcome.timed_out
    processes = docker_api.top(exec_turn.container_id)["Processes"] or []
    assert not [p for p in processes if "sleep" in " ".join(p)]


def test_a_wrapper_that_cannot_fork_says_so_instead_of_exiting_2(exec_turn, docker_api):
    """A call whose shell cannot fork (its processes bound full) fails as a setup error, named.

    dash exits 2 when a fork fails, even inside ``&&``: the call's code for
    its own misuse errors. The call's exact command runs here, in the turn,
    as the turn's uid, under a process bound of 1, so the first fork fails.
    """
    call = exec_argv(POLICY, ["echo", "ran"], outbox="/workspace/outbox/bound")
    argv = ["/bin/sh", "-c", 'ulimit -p 1 && exec "$@"', "sh", *call]
    exec_id = docker_api.exec_create(exec_turn.container_id, argv, user=exec_turn._user)["Id"]
    output = docker_api.exec_start(exec_id, demux=True)
    stderr = (output[1] or b"").decode()
    assert docker_api.exec_inspect(exec_id)["ExitCode"] == EXEC_SETUP_FAILED, stderr
    assert (output[0] or b"").replace(READY, b"") == b""
    assert "fork" in stderr
    assert "astralvessel: the sandbox could not start the command" in stderr


def test_is_never_chosen_automatically():
    """best_available never picks docker-exec: it does not keep every promise."""
    assert "docker-exec" not in AUTOMATIC_ORDER


def test_probe_declares_what_it_does_not_keep(docker_api):
    """doctor says docker-exec runs a docker exec per call and which promise that costs."""
    report = DockerExec(image=NOPYTHON_IMAGE, pull=False).probe()
    assert report.available, report.reason
    assert "exec per call" in report.details["mode"]
    assert set(report.unenforced) == {Promise.PROCESS_ISOLATION}


# -- output is bounded in bytes -------------------------------------------------------


def test_output_buffer_counts_undecodable_bytes():
    """Continuation bytes alone are characters too (each shows as one replacement character)."""
    buffer = OutputBuffer(10)
    for _ in range(100):
        buffer.add(b"\x80" * 65536)
    buffer.add(b"", final=True)
    assert buffer.text == "\ufffd" * 10
    assert buffer.dropped == 100 * 65536 - 10


def test_output_buffer_never_splits_a_character():
    """A character cut across two reads is counted once and kept whole."""
    buffer = OutputBuffer(3)
    data = "aé€😀".encode()
    for byte in data:
        buffer.add(bytes([byte]))
    buffer.add(b"", final=True)
    assert (buffer.text, buffer.dropped) == ("aé€", 1)


def test_continuation_byte_flood_is_cut(exec_turn):
    """50 MB of UTF-8 continuation bytes is cut at output_chars, and every dropped one counted."""
    outcome = _run(exec_turn, "head -c 50000000 /dev/zero | tr '\\000' '\\200'", output_chars=1000)
    assert outcome.output == "\ufffd" * 1000
    assert outcome.dropped_chars == 50_000_000 - 1000


def test_host_memory_stays_bounded_under_a_flood(docker_api):
    """A call printing 160 MB of continuation bytes leaves the host process far below that."""
    script = textwrap.dedent(
        f"""
        import json
        from astralvessel.sandbox import Policy, RunRequest, Limits
        from astralvessel.sandbox.docker import DockerExec
        policy = Policy(limits=Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256))
        session = DockerExec(image={NOPYTHON_IMAGE!r}, pull=False).start(policy)
        try:
            outcome = session.run(RunRequest(
                argv=["/bin/sh", "-c", "head -c 160000000 /dev/zero | tr '\\\\000' '\\\\200'"],
                timeout=120, output_chars=30000))
        finally:
            session.close()
        # VmHWM is this process's own peak: ru_maxrss would carry over the peak of the
        # process that spawned it (Linux keeps it across exec), here the whole test run's.
        with open("/proc/self/status") as status:
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        print(json.dumps({{"dropped": outcome.dropped_chars, "maxrss_kb": peak}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dropped"] == 160_000_000 - 30000
    # The interpreter and the SDK take about 60 MB; holding the flood would take 160 MB more
    # (300 MB proved no more, in twice the time).
    assert report["maxrss_kb"] < 150 * 1024


# -- the outbox: no links, a file count and a byte budget -----------------------------


def test_listing_parses_kinds_sizes_and_raw_names():
    """The listing is a count, then type-links/size/name records; a record cut short is left out."""
    data = b"6\0f1/3/a.txt\0f1/5/caf\xc3\xa9\0f1/7/\xff\xfe\0l1/11/link\0f3/9/hard\0f1/12"
    total, entries = parse_listing(data)
    assert total == 6
    assert entries == [
        OutboxEntry(name=b"a.txt", size=3, plain=True),
        OutboxEntry(name="café".encode(), size=5, plain=True),
        OutboxEntry(name=b"\xff\xfe", size=7, plain=True),
        OutboxEntry(name=b"link", size=11, plain=False),
        OutboxEntry(name=b"hard", size=9, plain=False),
    ]


def test_plan_keeps_the_budgets_and_names_the_servers_reasons():
    """Past the count or the byte budget, links and non-UTF-8 names are counted by reason."""
    entries = [OutboxEntry(name=f"f{i:03}".encode(), size=10, plain=True) for i in range(5)]
    entries += [
        OutboxEntry(name=b"\xff", size=1, plain=True),
        OutboxEntry(name=b"link", size=1, plain=False),
    ]
    take, skipped = plan_outbox(len(entries), entries, max_files=3, max_bytes=25)
    assert take == [("f000", 10), ("f001", 10)]
    assert skipped == {NOT_UTF8: 1, NOT_PLAIN: 1, TOO_BIG: 3}
    take, skipped = plan_outbox(len(entries) + 50, entries, max_files=3, max_bytes=1000)
    assert [name for name, _ in take] == ["f000", "f001", "f002"]
    assert skipped[TOO_MANY] == 2 + 50


def test_outbox_returns_regular_files(exec_turn):
    """A file left in $VESSEL_OUTBOX comes back with its bytes; without a host folder, the
    turn's temporary one outlives the turn while a result names it, and goes with the last."""
    outcome = _run(exec_turn, "printf 'hi there' > $VESSEL_OUTBOX/out.txt")
    (file,) = outcome.files
    assert (file.name, file.size, file.path.read_bytes()) == ("out.txt", 8, b"hi there")
    exec_turn.close()
    assert file.path.read_bytes() == b"hi there"
    folder = file.path.parent.parent
    del outcome, file
    gc.collect()
    assert not folder.exists()


def test_outbox_files_outlive_the_turn_in_the_hosts_folder(docker_api, tmp_path):
    """With the policy's outbox_dir, a call's files stay on the host after the turn ends."""
    backend = DockerExec(image=NOPYTHON_IMAGE, pull=False)
    session = backend.start(Policy(limits=SMALL_LIMITS, outbox_dir=tmp_path / "outbox"))
    try:
        outcome = _run(session, "echo kept > $VESSEL_OUTBOX/kept.txt")
    finally:
        session.close()
    (file,) = outcome.files
    assert tmp_path / "outbox" in file.path.parents
    assert file.path.read_text() == "kept\n"


def test_outbox_follows_no_links(exec_turn):
    """A symlink to a system file and a hard link to a workspace file never come back."""
    outcome = _run(
        exec_turn,
        "cd $VESSEL_OUTBOX && ln -s /etc/passwd passwd && head -c 1000000 /dev/zero > $HOME/big"
        " && for i in 1 2 3 4 5; do ln $HOME/big hard$i; done && echo plain > plain.txt",
    )
    assert [f.name for f in outcome.files] == ["plain.txt"]
    assert f"[outbox: 6 entries not returned: 6 {SKIPPED_WORDS[NOT_PLAIN]}]" in outcome.output


def test_an_unreadable_outbox_is_read_and_a_hard_link_keeps_its_files_mode(exec_turn):
    """A call that makes its outbox folder and a file mode 000 gets the file back (the
    listing gives the owner back its modes once the call is over); a workspace file it
    hard-linked there is left out and keeps its own mode 000; the folder is removed."""
    outcome = _run(
        exec_turn,
        "cd $VESSEL_OUTBOX && echo $VESSEL_OUTBOX > $HOME/where && echo shut > shut.txt "
        "&& chmod 0 shut.txt && echo w > $HOME/w && chmod 0 $HOME/w && ln $HOME/w hard "
        "&& chmod 0 $VESSEL_OUTBOX",
    )
    assert [f.name for f in outcome.files] == ["shut.txt"], outcome.output
    assert f"[outbox: 1 entries not returned: 1 {SKIPPED_WORDS[NOT_PLAIN]}]" in outcome.output
    after = _run(exec_turn, 'stat -c %a $HOME/w; [ -e "$(cat $HOME/where)" ] || echo gone')
    assert after.output == "0\ngone\n", after.output


def test_an_outbox_that_cannot_be_made_says_why(exec_turn):
    """A turn whose outbox folder cannot be made fails with mkdir's own words, not an empty
    reason."""
    exec_turn._outbox = "/proc/1/outbox"  # nothing may create a folder there
    with pytest.raises(SandboxError, match=r"prepare its workspace: mkdir: cannot create"):
        exec_turn.prepare()


def test_outbox_file_count_is_bounded(exec_turn):
    """A call that leaves thousands of files gets at most OUTBOX_MAX_FILES, and the host is told."""
    outcome = _run(exec_turn, "cd $VESSEL_OUTBOX && seq 1 3000 | xargs touch", timeout=60)
    assert len(outcome.files) == OUTBOX_MAX_FILES
    assert f"2900 {SKIPPED_WORDS[TOO_MANY]}" in outcome.output


def test_outbox_byte_budget_holds_against_sparse_files(exec_turn):
    """Sparse files that claim more than the disk limit in total are cut to the byte budget."""
    outcome = _run(
        exec_turn,
        "cd $VESSEL_OUTBOX && for i in 1 2 3 4 5; do truncate -s 10M sparse$i; done",
    )
    budget = SMALL_LIMITS.disk_mb * 1024 * 1024
    assert sum(f.size for f in outcome.files) <= budget
    assert len(outcome.files) == 1
    assert f"4 {SKIPPED_WORDS[TOO_BIG]}" in outcome.output


def test_outbox_odd_names_and_leftovers_do_not_break_the_turn(exec_turn):
    """A non-UTF-8 name and a deep folder are left out, the outbox is removed, the turn goes on."""
    outcome = _run(
        exec_turn,
        "cd $VESSEL_OUTBOX && touch \"$(printf 'bad\\377name')\" && mkdir -p a/b/c/d && echo ok",
    )
    assert outcome.output.startswith("ok\n[outbox: 2 entries not returned: ")
    assert SKIPPED_WORDS[NOT_UTF8] in outcome.output
    assert outcome.files == ()
    # The first call's folder is gone; only the running call's own is there.
    after = _run(exec_turn, "ls -A /workspace/outbox; echo $VESSEL_OUTBOX")
    assert after.output == "2\n/workspace/outbox/2\n"


def test_a_call_that_leaves_no_file_takes_one_exec_after_its_own(exec_turn, docker_api):
    """After a call that leaves its outbox empty, one exec ends its processes, lists the outbox
    and removes it (each exec costs the engine 0.1-0.2 s on a loaded host), and that holds."""
    since = time.time()
    # Its output elsewhere, the sleep holds no stream open: the call ends with its shell.
    outcome = _run(exec_turn, "sleep 300 >/dev/null 2>&1 & echo started")
    until = time.time()
    events = docker_api.events(
        since=since,
        until=until,
        filters={"container": exec_turn.container_id, "event": "exec_create"},
        decode=True,
    )
    assert len(list(events)) == 2
    assert (outcome.output, outcome.files) == ("started\n", ())
    processes = docker_api.top(exec_turn.container_id)["Processes"] or []
    assert not [p for p in processes if "sleep" in " ".join(p)]
    # The call's folder is gone; only the running call's own is there.
    assert _run(exec_turn, "ls -A /workspace/outbox").output == "2\n"


def test_base_image_runs_in_exec_mode_too(docker_api):
    """docker-exec is a mode, not an image: it runs an image that has Python the same way."""
    session = DockerExec(base_image=BASE_IMAGE, pull=False).start(POLICY)
    try:
        assert _run(session, "echo $VESSEL_OUTBOX").output == "/workspace/outbox/1\n"
        assert set(session.unenforced()) == {Promise.PROCESS_ISOLATION}
    finally:
        session.close()
