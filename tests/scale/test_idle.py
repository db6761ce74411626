"""What an idle turn holds: the server, its zygote and one spare init, and nothing else.

Every Python process of an idle turn costs memory (issue 17's target: <= 8 MiB PSS a
turn), so these tests pin the process tree's shape: a regression that adds a process
(a launcher that only waits, a worker started with the turn) fails here by count and role.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from astralvessel.sandbox import FsRequest, Policy, SandboxSession, _session
from astralvessel.sandbox._channels import PipeChannel
from astralvessel.sandbox._discovery import get_backend
from astralvessel.sandbox._session import BOOTSTRAP, ServerSession, server_payload

BACKENDS = ["bubblewrap", "nsjail"]
#: The sandbox binary's own processes above the server: bwrap's parent and its pid 1;
#: util-linux ``unshare``, which started nsjail (nsjail itself where the host has none).
BINARY_PROCESSES = {"bubblewrap": 2, "nsjail": 1}
#: Standard modules the server must not hold: each idle turn would carry them (see _lean).
#: And math: a shared library to load at every turn start for one rounding (``_lean``);
#: ``__future__``: the compiled modules' future statements are flags, not imports.
HEAVY_MODULES = {
    "__future__",
    "collections",
    "contextlib",
    "enum",
    "functools",
    "math",
    "re",
    "selectors",
    "socket",
}


def _parents() -> dict[int, int]:
    """Every live process's parent, from ``/proc``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _tree(root: int) -> set[int]:
    """``root`` and every process below it, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _pythons(session: SandboxSession) -> set[int]:
    """The turn's Python processes on the host (the sandbox binary's own are not Python)."""
    assert isinstance(session, ServerSession)
    assert isinstance(session.channel, PipeChannel)
    mine = set()
    for pid in _tree(session.channel.process.pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("python"):
                mine.add(pid)
        except OSError:
            continue
    return mine


def _settled(session: SandboxSession) -> set[int]:
    """The turn's Python processes once the spare is built: the same set for half a second."""
    deadline = time.monotonic() + 30
    seen = _pythons(session)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _pythons(session)
        if now == seen:
            return now
        seen = now
    pytest.fail(f"the idle turn never settled: {sorted(seen)}")


@pytest.mark.parametrize("name", BACKENDS)
def test_the_file_worker_starts_with_the_first_file_request(name: str) -> None:
    """An idle turn has no file worker; the first file request starts one, the next reuses it."""
    session = get_backend(name).start(Policy())
    try:
        idle = _settled(session)
        first = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert first.errno is None, first.message
        after_first = _pythons(session)
        second = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert second.errno is None, second.message
        after_second = _pythons(session)
    finally:
        session.close()
    (worker,) = after_first - idle
    assert worker in after_second
    assert after_second - after_first == set()


@pytest.mark.parametrize("name", BACKENDS)
def test_an_idle_turn_is_a_server_its_zygote_and_one_spare(name: str) -> None:
    """An idle turn is the sandbox binary's processes over three Python ones in a line:
    the server, the zygote it forked (no launcher between them), and the zygote's spare init."""
    session = get_backend(name).start(Policy())
    try:
        pythons = _settled(session)
        assert isinstance(session, ServerSession)
        assert isinstance(session.channel, PipeChannel)
        everything = _tree(session.channel.process.pid)
        parents = _parents()
        below_server = {pid for pid in everything if parents[pid] in pythons}
    finally:
        session.close()
    assert len(everything - pythons) == BINARY_PROCESSES[name], "the sandbox binary's own"
    (server,) = [pid for pid in pythons if parents[pid] not in pythons]
    (zygote,) = [pid for pid in pythons if parents[pid] == server]
    (spare,) = [pid for pid in pythons if parents[pid] == zygote]
    assert pythons == {server, zygote, spare}
    # Nothing of the turn hangs below the server that is not one of the three.
    assert below_server == {zygote, spare}


def test_the_server_loads_without_the_heavy_standard_modules() -> None:
    """The server's bootstrap loads every server module and imports none of ``HEAVY_MODULES``."""
    main = "p._main.main()"
    assert main in BOOTSTRAP
    # The real bootstrap and payload, with main replaced by a report of what is loaded.
    report = "print(' '.join(sorted(sys.modules)))"
    payload = server_payload()
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-B",
            "-c",
            BOOTSTRAP.replace(main, report),
            str(len(payload)),
        ],
        input=payload,
        capture_output=True,
        check=True,
        timeout=60,
    )
    loaded = set(done.stdout.decode().split())
    assert "_astralvessel_server._main" in loaded
    assert loaded & HEAVY_MODULES == set()


def _instead_of_main(code: str) -> str:
    """The real bootstrap with ``code`` run where main would be (in its function's body)."""
    main = "\n    p._main.main()\n"
    assert main in BOOTSTRAP
    return BOOTSTRAP.replace(main, "\n" + textwrap.indent(code, "    ") + "\n")


#: Forks the zygote the way the server does after ``hello``, then lists the modules that
#: appeared in the server meanwhile (the zygote's plan runs nothing here: it only waits).
_FORK_ZYGOTE = """\
before = set(sys.modules)
plan = p._launch.LaunchPlan(confine=False, pid_namespace=False, drop_uid=None, drop_gid=None,
    limits=None, seccomp=None, install_seccomp=None)
zygote = p._zygote.start(plan, {})
zygote.close()
print(' '.join(sorted(set(sys.modules) - before)))"""


def test_forking_the_zygote_imports_nothing_in_the_server() -> None:
    """The server imports no module when it forks its zygote: the import machinery would
    write (and so copy) pages the zygote still shares, about 0.7 MiB of every idle turn."""
    payload = server_payload()
    bootstrap = _instead_of_main(_FORK_ZYGOTE)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", bootstrap, str(len(payload))],
        input=payload,
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.decode().split() == []


#: Takes the memory watch's samples (every process's status, then this process's PSS,
#: memfds and pipes, as for a call past its limit), then lists the modules that appeared.
_SAMPLE_MEMORY = """\
before = set(sys.modules)
p._bounds.call_memory({}, 2)
assert p._bounds._pss(str(os.getpid())) > 0
held = os.pipe()
os.write(held[1], b"x")
assert p._bounds._descriptors(str(os.getpid()), set()) >= 4096
print(' '.join(sorted(set(sys.modules) - before)))"""


def test_the_memory_watch_imports_nothing_in_the_server() -> None:
    """The memory watch's first sample, taken during a turn's first call, imports no module
    (a text-mode open imported its codec): each would copy pages the zygote shares."""
    payload = server_payload()
    bootstrap = _instead_of_main(_SAMPLE_MEMORY)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", bootstrap, str(len(payload))],
        input=payload,
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.decode().split() == []


@pytest.mark.parametrize("name", BACKENDS)
def test_an_idle_file_worker_is_retired_and_the_next_request_starts_one(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file worker idle past its limit exits, so a turn waiting on its model holds no
    file tools; the next file request starts a fresh worker and is answered as before."""
    # Long enough that the worker is still there when the test looks for it after the
    # first request on a loaded machine (0.3 s was not, at load 27), far under the default.
    monkeypatch.setattr(_session, "FILE_WORKER_IDLE", 2.0)
    session = get_backend(name).start(Policy())
    try:
        idle = _settled(session)
        first = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert first.errno is None, first.message
        (worker,) = _pythons(session) - idle
        # Well under the default limit (30 s), so a hello whose limit is ignored fails here.
        deadline = time.monotonic() + 15
        while worker in _pythons(session) and time.monotonic() < deadline:
            time.sleep(0.1)
        retired = _pythons(session)
        second = session.fs(FsRequest(op="list", path="/workspace", timeout=30))
        assert second.errno is None, second.message
        after_second = _pythons(session)
    finally:
        session.close()
    assert worker not in retired
    assert retired == idle
    (fresh,) = after_second - retired
    assert fresh != worker
