"""The host's side of ``Turn.exec`` and the file primitives: what is refused before anything runs."""

from __future__ import annotations

import errno

import pytest

from astralvessel import (
    Executor,
    FileTooLargeError,
    Registry,
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    UsageError,
)
from astralvessel._executor import _exec as exec_module
from astralvessel.sandbox._api import FsReply


@pytest.fixture
def turn():
    """A bubblewrap turn whose sandbox has not started (and must not, for a refused request)."""
    executor = Executor(Registry(), sandbox="bubblewrap")
    with executor.turn() as opened:
        yield opened


@pytest.mark.parametrize(
    ("argv", "options", "message"),
    [
        ("ls -l", {}, "sequence of strings"),
        (b"ls", {}, "sequence of strings"),
        ([], {}, "empty"),
        (["ls", 3], {}, r"argv\[1\]"),
        (["ls", "a\0b"], {}, "NUL"),
        (["x" * (exec_module.ARGV_BYTES + 1)], {}, "ARG_MAX"),
        (["ls"], {"env": {"A": "b\0"}}, "NUL"),
        (["ls"], {"env": {"": "b"}}, "non-empty"),
        (["ls"], {"env": {"A=B": "b"}}, "without '='"),
        (["ls"], {"env": {"A": 1}}, "strings to strings"),
        (["ls"], {"env": ["A=b"]}, "mapping"),
        (["ls"], {"env": {"VESSEL_OUTBOX": "/tmp"}}, "VESSEL_OUTBOX"),
        (["ls"], {"timeout": 0}, "timeout"),
        (["ls"], {"timeout": float("nan")}, "timeout"),
        (["ls"], {"timeout": exec_module.MAX_TIMEOUT + 1}, "timeout"),
        (["ls"], {"timeout": True}, "timeout"),
        (["ls"], {"input": 5}, "input"),
        (["ls"], {"input": b"x" * (exec_module.INPUT_BYTES + 1)}, "input is"),
        (["ls"], {"cwd": "a\0b"}, "NUL"),
        (["ls"], {"cwd": ""}, "cwd"),
        ([""], {}, r"argv\[0\] must name a command"),
        (["ls", "a\ud800"], {}, r"argv\[1\] holds .*surrogate"),
        (["ls"], {"env": {"A": "\udcff"}}, "surrogate"),
        (["ls"], {"env": {"\ud800": "b"}}, "surrogate"),
        (["ls"], {"cwd": "/workspace/\udcff"}, "cwd holds .*surrogate"),
    ],
)
def test_exec_host_mistakes_raise_usage_error(turn, argv, options, message):
    """A bad argv, env, timeout, input or cwd raises one UsageError naming it; no sandbox starts."""
    with pytest.raises(UsageError, match=message):
        turn.exec(argv, **options)
    assert turn._session is None


@pytest.mark.parametrize("path", ["", "a\0b", 3, None])
def test_file_host_mistakes_raise_usage_error(turn, path):
    """A path that is not a non-empty string without NUL raises UsageError; no sandbox starts."""
    with pytest.raises(UsageError, match="path"):
        turn.read_file(path)
    with pytest.raises(UsageError, match="path"):
        turn.write_file(path, b"x")
    assert turn._session is None


def test_write_past_the_bound_is_a_usage_error(turn, monkeypatch):
    """Data past the file bound is refused before anything is sent."""
    monkeypatch.setattr(exec_module, "FILE_BYTES", 10)
    with pytest.raises(UsageError, match="at most 10"):
        turn.write_file("/workspace/big", b"x" * 11)
    with pytest.raises(UsageError, match="bytes or str"):
        turn.write_file("/workspace/big", 12)
    assert turn._session is None


@pytest.mark.parametrize(
    ("name", "cls", "builtin"),
    [
        ("ENOENT", SandboxFileNotFoundError, FileNotFoundError),
        ("EISDIR", SandboxIsADirectoryError, IsADirectoryError),
        ("ENOTDIR", SandboxNotADirectoryError, NotADirectoryError),
        ("EACCES", SandboxPermissionError, PermissionError),
        ("EROFS", SandboxPermissionError, PermissionError),
        ("EFBIG", FileTooLargeError, OSError),
        ("ELOOP", SandboxFileError, OSError),
        ("ENOSPC", SandboxFileError, OSError),
    ],
)
def test_each_refusal_raises_its_builtin(name, cls, builtin):
    """A refusal's errno picks the library error that is also the builtin a harness catches."""
    plan = exec_module.read_plan("/workspace/f", timeout=5.0)
    next(plan)
    with pytest.raises(cls) as caught:
        plan.send(FsReply(errno=name, message="refused"))
    assert isinstance(caught.value, builtin)
    assert caught.value.errno == getattr(errno, name)
    assert caught.value.filename == "/workspace/f"


def test_read_plan_stops_at_the_bound(monkeypatch):
    """A file that announces a size past the bound raises FileTooLargeError at the first chunk."""
    monkeypatch.setattr(exec_module, "FILE_BYTES", 100)
    plan = exec_module.read_plan("f", timeout=5.0)
    next(plan)
    with pytest.raises(FileTooLargeError, match="at most 100"):
        plan.send(FsReply(fields={"size": 101}, data=b"x" * 101))


def test_write_plan_moves_large_data_in_chunks():
    """Data larger than one chunk goes as several writes at rising offsets; only the first truncates."""
    data = b"a" * (2 * exec_module.CHUNK_BYTES + 5)
    plan = exec_module.write_plan("f", data, timeout=5.0)
    requests = [next(plan)]
    for _ in range(5):
        try:
            requests.append(plan.send(FsReply(fields={"size": 0})))
        except StopIteration:
            break
    assert [(r.offset, len(r.data), r.truncate) for r in requests] == [
        (0, exec_module.CHUNK_BYTES, True),
        (exec_module.CHUNK_BYTES, exec_module.CHUNK_BYTES, False),
        (2 * exec_module.CHUNK_BYTES, 5, False),
    ]
    assert b"".join(r.data for r in requests) == data


PASSWD = (
    b"root:x:0:0:root:/root:/bin/sh\n"
    b"alice:x:1000:1001::/home/alice:/bin/sh\n"
    b"alice:x:2000:2000::/:/bin/sh\n"
    b"broken:x:12:\n"
    b"huge:x:4294967295:0::/:/bin/sh\n"
    b"neg:x:-1:0::/:/bin/sh\n"
    b"\xff\xfe:x:7:7::/:/bin/sh\n"
)


@pytest.mark.parametrize(
    ("user", "ids"),
    [
        ("alice", (1000, 1001)),  # the first line that names the user
        (1000, (1000, 1001)),  # a uid takes its line's gid
        (4242, (4242, 4242)),  # and, with no line, itself
        ("broken", None),  # a line without a gid field
        ("huge", None),  # (uid_t) -1 is no id
        ("neg", None),
        ("nobody", None),
        ("al", None),  # names match whole
        ("\udcff\udcfe", (7, 7)),  # a name that is not UTF-8 matches byte for byte
    ],
)
def test_find_user_reads_passwd_as_the_first_matching_line(user, ids):
    """A name matches a line's first field exactly, a uid its third; malformed lines are skipped."""
    assert exec_module.find_user(PASSWD, user) == ids


def _resolve(user, reply, *, root_identity=True):
    """Drive exec_plan's one step with ``reply``; return what it gives for ``user``."""
    request = exec_module.exec_request(
        ["id"], input=None, cwd=None, env=None, timeout=None, default_timeout=5, workdir="/w"
    )
    plan = exec_module.exec_plan(request, user, root_identity=root_identity, timeout=5)
    try:
        step = next(plan)
    except StopIteration as done:
        return done.value
    assert (step.op, step.path) == ("read", "/etc/passwd")
    try:
        plan.send(reply)
    except StopIteration as done:
        return done.value
    raise AssertionError("exec_plan asked for a second step")


def test_exec_plan_maps_a_user_and_fails_an_unknown_one():
    """A listed user becomes the request's ids; an unknown one is exit 126 naming it; root and 0
    need no lookup; an unreadable or oversized passwd lists nobody but uids still run."""
    ok = FsReply(fields={"size": len(PASSWD)}, data=PASSWD)
    assert _resolve("alice", ok).user == (1000, 1001)
    assert _resolve("root", ok).user is None  # the root identity's own ids: the spare's
    assert _resolve("0", ok).user is None
    missing = _resolve("ghost", ok)
    assert missing.returncode == 126
    assert b"'ghost'" in missing.stderr
    unreadable = FsReply(errno="EACCES", message="denied")
    assert _resolve("alice", unreadable).returncode == 126
    assert _resolve(77, unreadable).user == (77, 77)
    oversized = FsReply(fields={"size": exec_module.PASSWD_BYTES + 1}, data=PASSWD)
    assert b"over" in _resolve("alice", oversized).stderr


@pytest.mark.parametrize("user", ["root", "nobody", 0, 7])
def test_user_without_root_identity_is_a_usage_error(user):
    """Without the root identity there is one user: any user= is refused before anything runs."""
    with pytest.raises(UsageError, match="root identity"):
        _resolve(user, FsReply(), root_identity=False)


def test_a_listing_is_a_list_that_says_it_was_cut():
    """A Listing compares as its list, keeps ``truncated`` through pickle (Ray), shows both."""
    import pickle

    listing = exec_module.Listing([("caf\udce9", "file")], truncated=True)
    assert listing == [("caf\udce9", "file")]
    copy = pickle.loads(pickle.dumps(listing))  # noqa: S301 - our own bytes
    assert copy == listing
    assert copy.truncated
    assert "truncated=True" in repr(listing)
    assert not exec_module.Listing().truncated


def test_list_records_are_parsed_as_fsdecode_names():
    """The server's ``KIND/NAME\\0`` records become names as ``os.fsdecode`` gives them."""
    plan = exec_module.list_plan("/workspace", timeout=5.0, limit=3)
    request = next(plan)
    assert request.limit == 3
    records = b"file/caf\xe9\0dir/a\nb\0link/\x1b[0m\0"
    with pytest.raises(StopIteration) as done:
        plan.send(FsReply(fields={"count": 3, "more": True}, data=records))
    listing = done.value.value
    assert listing == [("caf\udce9", "file"), ("a\nb", "dir"), ("\x1b[0m", "link")]
    assert listing.truncated
