"""The sandbox server's wire format and boot: framing, character counting, bad frames."""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import marshal
import struct
import subprocess
import sys
from importlib import resources
from types import CodeType

import pytest

from astralvessel.sandbox import _boot_server
from astralvessel.sandbox._server_code import _COMPILE
from astralvessel.sandbox._session import BOOTSTRAP, SERVER_MODULES, server_command, server_payload
from astralvessel.sandbox.server import _protocol


def _frames(decoder: _protocol.FrameDecoder) -> list[tuple[dict[str, object], bytes]]:
    found = []
    while (frame := decoder.next()) is not None:
        found.append(frame)
    return found


def test_frame_round_trip() -> None:
    """A frame decodes to the header and body it was encoded from."""
    decoder = _protocol.FrameDecoder()
    decoder.feed(_protocol.encode({"type": "run", "id": 7, "argv": ["é", "x"]}, b"\x00\xffbody"))
    assert _frames(decoder) == [({"type": "run", "id": 7, "argv": ["é", "x"]}, b"\x00\xffbody")]
    assert decoder.buffered == 0


def test_frames_arrive_byte_by_byte() -> None:
    """Frames split at every byte boundary still decode, in order."""
    data = b"".join(_protocol.encode({"type": "out", "id": i}, bytes([i]) * i) for i in range(5))
    decoder = _protocol.FrameDecoder()
    found = []
    for byte in data:
        decoder.feed(bytes([byte]))
        found += _frames(decoder)
    assert [(h["id"], b) for h, b in found] == [(i, bytes([i]) * i) for i in range(5)]


def test_big_body_round_trip() -> None:
    """A 40 MB body crosses intact."""
    body = bytes(range(256)) * (40 * 4096)
    decoder = _protocol.FrameDecoder()
    decoder.feed(_protocol.encode({"type": "file", "id": 1}, body))
    assert _frames(decoder) == [({"type": "file", "id": 1}, body)]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (struct.pack("!II", 3, 0) + b"{x}", "not UTF-8 JSON"),
        (struct.pack("!II", 2, 0) + b"[]", "JSON object with a string 'type'"),
        (struct.pack("!II", 1 << 30, 0), "header of"),
        (struct.pack("!II", 2, 1 << 31), "body of"),
    ],
)
def test_malformed_frames_raise(raw: bytes, message: str) -> None:
    """A malformed or oversized frame raises ProtocolError saying what is wrong."""
    decoder = _protocol.FrameDecoder()
    decoder.feed(raw)
    with pytest.raises(_protocol.ProtocolError, match=message):
        decoder.next()


def test_count_chars_counts_code_points() -> None:
    """Characters are counted as UTF-8 code points, not bytes."""
    assert _protocol.count_chars("aé€😀".encode()) == 4


def test_split_chars_never_splits_a_character() -> None:
    """The cut keeps whole characters, including continuation bytes of the last one kept."""
    data = "aé€😀b".encode()
    assert data[: _protocol.split_chars(data, 3)].decode() == "aé€"
    assert _protocol.split_chars(data, 99) == len(data)
    # A stray continuation byte is a character of its own (a reader shows U+FFFD).
    assert _protocol.split_chars("é".encode()[1:] + b"x", 1) == 1
    assert _protocol.count_chars(b"\x80" * 10) == 10


def test_server_sources_parse_as_python_38() -> None:
    """Every server module and the bootstrap use only Python 3.8 syntax (Docker images may be old)."""
    package = resources.files("astralvessel.sandbox.server")
    sources = marshal.loads(server_payload())["src"]  # noqa: S302 - our own payload
    assert next(iter(sources)) == "_lean"
    assert list(sources)[-1] == "_main"
    for name in SERVER_MODULES:
        path = package / f"{name}.py"
        if path.is_file():
            ast.parse(path.read_text(), filename=name, feature_version=(3, 8))
    ast.parse(BOOTSTRAP, feature_version=(3, 8))
    ast.parse(_COMPILE, feature_version=(3, 8))


def _global_names(code: CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names


@pytest.mark.parametrize(
    ("text", "function"),
    [(BOOTSTRAP, "_astralvessel_serve"), (_COMPILE, "_astralvessel_compile")],
    ids=["serve", "compile"],
)
def test_the_bootstraps_are_their_functions_sent_alone(text: str, function: str) -> None:
    """What the sandbox's Python runs is ``_boot_server``'s function, cut whole, and one call:
    it reads no global of its module (a NameError in every sandbox) but builtins."""
    source = inspect.getsource(getattr(_boot_server, function))
    assert text == f"\n{source}{function}('_astralvessel_server')\n"
    code = compile(text, "<bootstrap>", "exec")
    (body,) = [c for c in code.co_consts if isinstance(c, CodeType)]
    assert _global_names(body) <= set(dir(builtins))


def _raw_server(*frames: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        server_command(sys.executable),
        input=server_payload() + b"".join(frames),
        capture_output=True,
        timeout=30,
        check=False,
    )


def test_malformed_frame_gets_a_clear_error() -> None:
    """A server sent garbage answers with an error frame naming the problem, then exits."""
    done = _raw_server(struct.pack("!II", 5, 0) + b"nope!")
    decoder = _protocol.FrameDecoder()
    decoder.feed(done.stdout)
    ((header, _),) = _frames(decoder)
    assert header["type"] == "error"
    assert header["id"] is None
    assert "malformed frame from the host" in str(header["message"])


def test_requests_before_hello_are_refused() -> None:
    """A request before hello is a protocol error, not a crash."""
    done = _raw_server(_protocol.encode({"type": "run", "id": 1, "argv": ["true"]}))
    decoder = _protocol.FrameDecoder()
    decoder.feed(done.stdout)
    ((header, _),) = _frames(decoder)
    assert header == {"type": "error", "id": None, "message": "expected 'hello' first, got 'run'"}


def test_cut_payload_is_reported_on_stderr() -> None:
    """A server whose payload is cut short exits saying so."""
    done = subprocess.run(
        server_command(sys.executable),
        input=server_payload()[:100],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert b"payload cut short" in done.stderr


def test_file_name_bytes_cross_a_frame_as_themselves():
    """``os.fsdecode``'s escapes travel as their bytes and come back as the same escapes."""
    name = "/workspace/caf\udce9\udcff\udc80"
    frame = _protocol.encode({"type": "fs", "path": name})
    assert b"caf\xe9\xff\x80" in frame
    decoder = _protocol.FrameDecoder()
    decoder.feed(frame)
    assert _frames(decoder) == [({"type": "fs", "path": name}, b"")]


def test_a_surrogate_that_stands_for_no_byte_crosses_as_a_replacement():
    """Any other lone surrogate cannot be a byte: it arrives as U+FFFD, never breaking the frame."""
    decoder = _protocol.FrameDecoder()
    decoder.feed(_protocol.encode({"type": "x", "text": "a\ud800b\udcffc"}))
    assert _frames(decoder) == [({"type": "x", "text": "a\ufffdb\udcffc"}, b"")]
