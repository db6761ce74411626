"""``Turn.exec(user=)``: a command sees itself as a user of the sandbox, and gains nothing.

Under ``root_identity`` an exec may name a user of the sandbox's own
``/etc/passwd`` (one ``adduser`` made, say). The call's user namespace then
maps that user's uid and gid, instead of 0, to the turn's one host identity:
the user changes what the command sees, never what it can reach. These tests
check both halves on every backend with a sandbox server: the users work as
inspect's self-check expects, and a call as another user is still the turn's
host identity, holds no capability, keeps the turn's limits, reads nothing of
another turn, and cannot give a file away (the chown family succeeds and
changes nothing). Without ``root_identity`` there is one user, and ``user=``
is the host's mistake.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel import Executor, Turn
from astralvessel.errors import SandboxError, UsageError
from astralvessel.registry import Registry
from astralvessel.sandbox import Mount
from astralvessel.sandbox._api import MAX_ID, ExecRequest
from astralvessel.sandbox._discovery import get_backend

from .calls import wait_until_gone
from .conftest import TEST_LIMITS

ROOT = os.geteuid() == 0
#: A writable root seeds every directory of /usr into the workspace: room for it.
LIMITS = attrs.evolve(TEST_LIMITS, disk_mb=64)
#: Every backend that runs the sandbox server (``docker-exec`` refuses ``root_identity``).
SERVER_BACKENDS = ["bubblewrap", "nsjail", "docker"]
ADDUSER = ["adduser", "--comment", "conformance", "--disabled-password"]
OpenTurn = Callable[..., Turn]


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A host folder every turn of the test mounts writable at /out."""
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


def _executor(backend: str, out: Path, *, root_identity: bool = True) -> Executor:
    """An executor of ``backend`` with ``out`` mounted at /out and a writable root."""
    return Executor(
        Registry(),
        sandbox=get_backend(backend),
        mounts=(Mount.from_pair("/out", out, writable=True),),
        limits=LIMITS,
        timeout_seconds=30.0,
        writable_root=True,
        root_identity=root_identity,
    )


@pytest.fixture(params=SERVER_BACKENDS)
def open_turn(request: pytest.FixtureRequest, out: Path) -> Iterator[OpenTurn]:
    """Open turns of the backend with /out mounted (root identity and writable root by default)."""
    executors: list[Executor] = []

    def start(*, root_identity: bool = True) -> Turn:
        executor = _executor(request.param, out, root_identity=root_identity)
        executors.append(executor)
        return executor.turn()

    try:
        yield start
    finally:
        for executor in executors:
            executor.close()


def _adduser(turn: Turn, name: str) -> None:
    result = turn.exec([*ADDUSER, name], user="root", timeout=30)
    assert result.returncode == 0, result.stderr


@attrs.frozen
class UserTurn:
    """A root-identity turn whose passwd lists ``avtest``, and the host folder at its /out."""

    turn: Turn
    out: Path


@pytest.fixture(scope="module", params=SERVER_BACKENDS)
def user_turn(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UserTurn]:
    """One such turn per backend, shared by the tests that only run commands in it as its
    users (each a writable-root turn and an adduser of its own cost 2-3 s)."""
    out = tmp_path_factory.mktemp("out")
    out.chmod(0o777)
    with _executor(request.param, out) as executor, executor.turn() as turn:
        _adduser(turn, "avtest")
        yield UserTurn(turn, out)


def test_adduser_then_commands_as_each_user(open_turn: OpenTurn):
    """adduser as root works; whoami and id then name root, the new user, and nobody."""
    turn = open_turn()
    _adduser(turn, "avtest")
    assert turn.exec(["whoami"], user="root").stdout == b"root\n"
    assert turn.exec(["whoami"], user="avtest").stdout == b"avtest\n"
    ids = turn.exec(["id", "-u", "avtest"]).stdout.strip()
    assert turn.exec(["id", "-u"], user="avtest").stdout.strip() == ids
    assert turn.exec(["id", "-u"], user=int(ids)).stdout.strip() == ids
    assert turn.exec(["id", "-un"], user="nobody").stdout == b"nobody\n"
    # The new user's home is its own, as the user sees it.
    home = turn.exec(["stat", "-c", "%u", "/home/avtest"], user="avtest").stdout.strip()
    assert home == ids
    assert turn.exec(["userdel", "avtest"], user="root").returncode == 0
    gone = turn.exec(["whoami"], user="avtest")
    assert gone.returncode == 126
    assert b"'avtest'" in gone.stderr


def test_every_user_is_the_turns_one_host_identity(user_turn: UserTurn):
    """What root, a new user and nobody create in a host mount belongs to one and the same host uid."""
    turn, out = user_turn.turn, user_turn.out
    for user in ("root", "avtest", "nobody", 4242):
        result = turn.exec(["sh", "-c", f"echo x > /out/by-{user}"], user=user)
        assert result.returncode == 0, result.stderr
    owners = {(out / f"by-{user}").stat().st_uid for user in ("root", "avtest", "nobody", 4242)}
    assert len(owners) == 1
    if not ROOT:
        assert owners == {os.geteuid()}


def test_a_user_holds_no_capability_and_cannot_become_root(user_turn: UserTurn):
    """As another user every capability set is empty, no_new_privs is set, and setuid(0),
    a new user namespace and a set-id program all fail."""
    turn = user_turn.turn
    status = turn.exec(["cat", "/proc/self/status"], user="avtest").stdout.decode()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[name], 16) == 0, name
    assert fields["NoNewPrivs"].strip() == "1"
    attempts = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, step in [('setuid', lambda: libc.setuid(0)),\n"
        "                   ('unshare', lambda: libc.unshare(0x10000000))]:\n"
        "    print(name, 'refused' if step() == -1 else 'WORKED', ctypes.get_errno())\n"
    )
    result = turn.exec(["python3", "-c", attempts], user="avtest")
    assert result.returncode == 0, result.stderr
    assert b"WORKED" not in result.stdout
    assert result.stdout.count(b"refused") == 2
    # su is set-uid root on disk; with no_new_privs it runs as the user and cannot switch.
    su = turn.exec(["su", "-c", "id -u", "root"], user="avtest", input=b"")
    assert su.returncode != 0


def test_chown_is_a_no_op_that_changes_nothing_on_the_host(open_turn: OpenTurn, out: Path):
    """Under the root identity every chown succeeds and changes no owner, in the sandbox or on
    the host; without it, a chown to another id is refused as before."""
    turn = open_turn()
    assert turn.exec(["sh", "-c", "echo x > /out/mine"]).returncode == 0
    before = (out / "mine").stat()
    for argv in (
        ["chown", "1000:1000", "/out/mine"],
        ["chown", "-h", "0:0", "/out/mine"],
        ["python3", "-c", "import os; os.chown('/out/mine', 4321, 4321)"],
        ["python3", "-c", "import os; os.lchown('/out/mine', 7, 7)"],
        ["python3", "-c", "import os; f = os.open('/out/mine', os.O_RDONLY); os.fchown(f, 9, 9)"],
    ):
        result = turn.exec(argv)
        assert result.returncode == 0, (argv, result.stderr)
    after = (out / "mine").stat()
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert turn.exec(["stat", "-c", "%u:%g", "/out/mine"]).stdout == b"0:0\n"
    plain = open_turn(root_identity=False)
    assert plain.exec(["sh", "-c", "echo x > /out/plain"]).success
    refused = plain.exec(["python3", "-c", "import os; os.chown('/out/plain', 1000, 1000)"])
    assert refused.returncode != 0
    assert b"PermissionError" in refused.stderr or b"Invalid argument" in refused.stderr


def test_a_user_reads_nothing_of_another_turn(open_turn: OpenTurn, out: Path):
    """A file one turn leaves closed in a shared mount stays closed to another turn's root and
    users (as root, each turn is a host uid of its own; as an ordinary user, both are the user)."""
    first, second = open_turn(), open_turn()
    assert first.exec(["sh", "-c", "echo secret > /out/first; chmod 600 /out/first"]).success
    _adduser(second, "avtest")
    for user in ("root", "avtest", 0, 12345):
        result = second.exec(["cat", "/out/first"], user=user)
        if ROOT:
            assert result.returncode != 0, user
            assert b"secret" not in result.stdout
        else:
            # An unprivileged namespace maps only the user's own id: both turns are that user.
            assert (out / "first").stat().st_uid == os.geteuid()


def test_a_user_keeps_the_turns_limits_and_timeout(user_turn: UserTurn):
    """A call as another user has the same rlimits as the turn's own, and its timeout kills
    its whole process tree."""
    turn = user_turn.turn
    own = turn.exec(["cat", "/proc/self/limits"]).stdout
    assert turn.exec(["cat", "/proc/self/limits"], user="avtest").stdout == own
    started = turn.exec(["sh", "-c", "sleep 6061.5 & sleep 6062.5"], user="avtest", timeout=1)
    assert started.timed_out
    assert wait_until_gone("6061.5") == []


def test_many_users_at_once(user_turn: UserTurn):
    """Twelve execs at once as root, a new user and numeric uids each see their own uid."""
    turn = user_turn.turn
    uid = int(turn.exec(["id", "-u", "avtest"]).stdout)
    users: list[str | int] = ["root", "avtest", 0, 7, 1234, MAX_ID] * 2
    expected = [0, uid, 0, 7, 1234, MAX_ID] * 2

    async def all_at_once() -> list[bytes]:
        results = await asyncio.gather(
            *(turn.aexec(["sh", "-c", "sleep 0.2; id -u"], user=user) for user in users)
        )
        return [result.stdout for result in results]

    assert asyncio.run(all_at_once()) == [f"{n}\n".encode() for n in expected]


#: Users the host refuses before anything runs: empty, NUL-bearing, huge or malformed names,
#: ids out of range, and values that are no name or id at all.
HOSTILE_USERS: tuple[object, ...] = (
    *("", "a\0b", "x" * 257, "name:0", "two\nlines"),
    *(-1, MAX_ID + 1, 2**64, True, 1.5, b"root"),
)
#: Users no passwd of the sandbox lists, some shaped as paths or patterns.
UNKNOWN_USERS = ("nonexistent", "../../etc/passwd", "root/..", "*", "+")


def test_hostile_users_are_the_hosts_mistake(open_turn: OpenTurn):
    """An empty, NUL-bearing, huge or malformed name, an id out of range or a non-name is
    UsageError, and nothing runs (the cases share one turn: none runs anything)."""
    turn = open_turn()
    for user in HOSTILE_USERS:
        with pytest.raises(UsageError):
            turn.exec(["touch", "/out/ran"], user=user)  # type: ignore[arg-type]
        assert turn.exec(["ls", "/out"]).stdout == b"", user


def test_unknown_user_is_a_failed_result_that_names_it(open_turn: OpenTurn):
    """A user the sandbox's passwd does not list is exit 126 naming it; the command never runs
    (the cases share one turn: none runs anything)."""
    turn = open_turn()
    for user in UNKNOWN_USERS:
        result = turn.exec(["touch", "/out/ran"], user=user)
        assert result.returncode == 126, user
        assert repr(user).encode() in result.stderr, user
        assert turn.exec(["ls", "/out"]).stdout == b"", user


def test_hostile_passwd_cannot_stall_or_fool_the_lookup(open_turn: OpenTurn):
    """A passwd that is a FIFO, a link to /proc, or garbage leaves the lookup quick and honest:
    unknown users fail, malformed lines are skipped, numeric users still run."""
    turn = open_turn()
    garbage = "\n".join(
        ["evil:x:notanumber:0::/:/bin/sh", "big:x:99999999999:0::/:/bin/sh", "short:x:5", ""]
    )
    assert turn.exec(["sh", "-c", f"printf '{garbage}' > /etc/passwd"]).success
    for name in ("evil", "big", "short"):
        assert turn.exec(["id", "-u"], user=name).returncode == 126
    assert turn.exec(["id", "-u"], user=77).stdout == b"77\n"
    for setup in ("rm /etc/passwd; mkfifo /etc/passwd", "ln -sf /proc/self/environ /etc/passwd"):
        assert turn.exec(["sh", "-c", setup]).success
        result = turn.exec(["id", "-u"], user="root2", timeout=10)
        assert result.returncode == 126
        assert not result.timed_out
    assert turn.exec(["id", "-u"], user=77).stdout == b"77\n"


def test_user_needs_the_root_identity(open_turn: OpenTurn):
    """Without root_identity there is one user: any user= is UsageError, and nothing runs."""
    turn = open_turn(root_identity=False)
    for user in ("root", "nobody", 0, 65534):
        with pytest.raises(UsageError, match="root identity"):
            turn.exec(["touch", "/out/ran"], user=user)
    assert turn.exec(["ls", "/out"]).stdout == b""


def test_the_server_refuses_a_user_without_the_root_identity(open_turn: OpenTurn, out: Path):
    """A request that names ids under a policy without root_identity is refused by the sandbox
    server itself (not only the host's check), and nothing runs."""
    turn = open_turn(root_identity=False)
    request = ExecRequest(argv=("touch", "/out/ran"), timeout=10.0, output_bytes=1024, user=(0, 0))
    with pytest.raises(SandboxError, match="root_identity"):
        turn.session.exec(request)
    assert not (out / "ran").exists()
