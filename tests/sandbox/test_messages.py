"""The messages between the host and the sandbox server: one class each, read and written
the same way by both sides, a field out of place refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astralvessel.sandbox._base import ServerOptions
from astralvessel.sandbox._policy import Policy
from astralvessel.sandbox._server_hello import hello_message
from astralvessel.sandbox._session import server_command, server_payload
from astralvessel.sandbox.server import _protocol
from astralvessel.sandbox.server._messages import (
    READERS,
    Adopt,
    Cancel,
    FileOp,
    Freeze,
    Message,
    Ready,
    Restore,
    Run,
    Shutdown,
    Snapshot,
)


def _hello(workspace: str = "/tmp") -> Message:
    options = ServerOptions(confine=False, path_map={"/workspace": workspace})
    return hello_message(Policy(), options, file_worker_idle=30.0)


SAMPLES: list[Message] = [
    _hello(),
    Ready(
        egress=None,
        version=_protocol.VERSION,
        python="3.11.7",
        pid=2,
        uid=0,
        euid=0,
        gid=0,
        confine=True,
        pid_namespace=True,
        seccomp=True,
        fs=True,
        problems={},
        relaxations={"writable_root": "needs namespaces"},
        probed={"seccomp": "no filter here"},
    ),
    Run(argv_bytes=3, timeout=5, output_chars=100),
    Run(split=True, argv=["ls", "-l"], env={"A": "b"}, user=[1000, 1000], output_bytes=10),
    FileOp(op="view", view="lines", arguments={"path": "/workspace/a", "offset": 2}),
    Snapshot(op="pack", phase="list", max_files=11),
    Restore(op="unpack", index_bytes=40),
    Freeze(op="freeze", upper_bytes=64 << 20),
    Freeze(op="freeze", phase="release", fd=7),
    Adopt(),
    Cancel(),
    Shutdown(),
]


def test_every_message_type_has_its_reader() -> None:
    """The table names each class by its frame type, and every sample is one of them."""
    assert {type(m) for m in SAMPLES} == set(READERS.values())
    assert all(READERS[cls.TYPE] is cls for cls in READERS.values())


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_reads_back_what_it_wrote_through_a_frame(message: Message) -> None:
    """What one side writes, with an id, the other reads as the same message."""
    decoder = _protocol.FrameDecoder()
    decoder.feed(_protocol.encode(message.to_json(7)))
    frame = decoder.next()
    assert frame is not None
    header, _ = frame
    assert header["id"] == 7
    assert READERS[header["type"]].from_json(header) == message


def test_a_field_at_its_default_is_left_out() -> None:
    """A tool call's run header carries only what differs from the defaults."""
    assert Run(argv_bytes=4, timeout=30.0, output_chars=30000).to_json(1) == {
        "type": "run",
        "argv_bytes": 4,
        "id": 1,
    }
    assert FileOp(op="list", path="/workspace").to_json() == {
        "type": "fs",
        "op": "list",
        "path": "/workspace",
    }


def test_the_hello_always_carries_every_field() -> None:
    """The hello has no defaults: every field is in its header, in declared order."""
    hello = _hello()
    header = hello.to_json()
    assert list(header) == ["type", *hello.fields()]
    assert header["probed"] is None


@pytest.mark.parametrize(
    ("header", "error", "words"),
    [
        ({"type": "run", "bogus": 1}, ValueError, "'run' message: unknown field 'bogus'"),
        ({"type": "run", "timeout": "1"}, TypeError, "'timeout' must be float, not '1'"),
        ({"type": "run", "argv_bytes": True}, TypeError, "'argv_bytes' must be int | None"),
        ({"type": "run", "env": {"A": 1}}, TypeError, "'env' must be dict[str, str] | None"),
        ({"type": "run", "user": [1, "0"]}, TypeError, "'user' must be list[int] | None"),
        ({"type": "fs", "path": "/a"}, ValueError, "'fs' message: 'op' is missing"),
        ({"type": "snapshot", "op": "pack"}, ValueError, "'phase' is missing"),
        ({"type": "fs", "op": "read"}, ValueError, "expected a 'run' message, got 'fs'"),
    ],
)
def test_a_field_out_of_place_is_refused_by_name(
    header: dict[str, object], error: type[Exception], words: str
) -> None:
    """A missing, unknown or mistyped field, or another type, fails naming what is wrong."""
    cls = READERS[str(header["type"])] if "expected" not in words else Run
    with pytest.raises(error) as caught:
        cls.from_json(header)
    assert words in str(caught.value)


def test_a_hello_is_checked_beyond_its_types() -> None:
    """The hello's limits, egress and idle time are checked as the server needs them."""
    header = _hello().to_json()
    changes: list[tuple[dict[str, object], str]] = [
        ({"limits": {"disk_mb": 1}}, "'limits' must hold exactly"),
        ({"egress": {"socket": "/s"}}, "'egress' must be null or name a socket and a port"),
        ({"file_worker_idle": 0}, "'file_worker_idle' must be positive"),
    ]
    for change, words in changes:
        with pytest.raises(ValueError, match=words):
            READERS["hello"].from_json({**header, **change})


def test_a_freeze_is_checked_beyond_its_types() -> None:
    """A freeze names its phase, and a freeze (not a release, nor the steps around the
    host's) its upper layer's bound."""
    changes: list[tuple[dict[str, object], str]] = [
        ({"phase": "thaw", "upper_bytes": 1}, "'phase' must be one of"),
        ({}, "'upper_bytes' must be positive"),
        ({"upper_bytes": 0}, "'upper_bytes' must be positive"),
    ]
    for change, words in changes:
        with pytest.raises(ValueError, match=words):
            READERS["freeze"].from_json({"type": "freeze", "op": "freeze", **change})
    assert Freeze(op="freeze", phase="release", fd=3).upper_bytes == 0
    # The host's own freeze (Docker's): neither step names a bound.
    for phase in ("prepare", "frozen"):
        assert Freeze(op="freeze", phase=phase).upper_bytes == 0


def test_a_message_is_frozen() -> None:
    """A message built is the message sent: no field changes after."""
    message = Run(argv_bytes=1)
    with pytest.raises(AttributeError):
        message.timeout = 1.0  # type: ignore[misc]
    assert message.replace(timeout=1.0).timeout == 1.0
    assert message.timeout == 30.0


def test_the_server_refuses_a_request_with_a_field_out_of_place(tmp_path: Path) -> None:
    """A real server answers a run with an unknown field with an error for that request
    (the field named), and goes on to answer the next request."""
    frames = [
        _protocol.encode(_hello(str(tmp_path)).to_json()),
        _protocol.encode({"type": "run", "id": 1, "argv": ["true"], "bogus": 1}),
        _protocol.encode({"type": "fs", "id": 2, "op": "list", "path": 3}),
        _protocol.encode(Shutdown().to_json()),
    ]
    done = subprocess.run(
        server_command(sys.executable),
        input=server_payload() + b"".join(frames),
        capture_output=True,
        timeout=60,
        check=False,
    )
    decoder = _protocol.FrameDecoder()
    decoder.feed(done.stdout)
    headers = []
    while (frame := decoder.next()) is not None:
        headers.append(frame[0])
    assert [h["type"] for h in headers] == ["ready", "error", "error"], done.stderr
    assert Ready.from_json(headers[0]).confine is False
    assert headers[1] == {
        "type": "error",
        "id": 1,
        "message": "'run' message: unknown field 'bogus'",
    }
    assert headers[2]["id"] == 2
    assert "'path' must be str, not 3" in str(headers[2]["message"])
