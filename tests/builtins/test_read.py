"""read: numbered lines, offset and limit, long lines, continuation, and what it refuses."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from astralvessel.builtins import BUILTINS
from astralvessel.sandbox.server import _files

from .conftest import Call, Tree


def _lines(path: Path, count: int) -> None:
    path.write_text("".join(f"line {n}\n" for n in range(1, count + 1)))


def test_lines_are_numbered_with_a_tab(tree: Tree, call: Call) -> None:
    """Each line is shown as its number, a tab, and its text."""
    (tree.data / "a.txt").write_text("alpha\nbeta\n")
    assert call("read", path="a.txt") == ("1\talpha\n2\tbeta", False)


def test_offset_defaults_to_one(tree: Tree, call: Call) -> None:
    """Without offset, reading starts at line 1."""
    _lines(tree.data / "a.txt", 3)
    text, _ = call("read", path="a.txt")
    assert text.splitlines()[0] == "1\tline 1"


def test_offset_picks_the_first_line(tree: Tree, call: Call) -> None:
    """offset names the first line returned, and numbering follows the file."""
    _lines(tree.data / "a.txt", 5)
    assert call("read", path="a.txt", offset=4) == ("4\tline 4\n5\tline 5", False)


def test_limit_defaults_to_400_and_names_the_next_offset(tree: Tree, call: Call) -> None:
    """Without limit, 400 lines come back, then a line naming offset 401."""
    _lines(tree.data / "a.txt", 500)
    lines = call("read", path="a.txt")[0].splitlines()
    assert len(lines) == 401
    assert lines[399] == "400\tline 400"
    assert lines[400] == "[more lines follow; call read with offset=401 to continue]"


def test_limit_up_to_2000_is_honoured(tree: Tree, call: Call) -> None:
    """A limit of 2000 returns 2000 lines."""
    _lines(tree.data / "a.txt", 2500)
    lines = call("read", path="a.txt", limit=2000)[0].splitlines()
    assert len(lines) == 2001
    assert lines[1999] == "2000\tline 2000"
    assert "offset=2001" in lines[2000]


def test_limit_above_2000_is_refused(tree: Tree, call: Call) -> None:
    """A limit above 2000 is the model's mistake, and the schema says so too."""
    _lines(tree.data / "a.txt", 3)
    text, is_error = call("read", path="a.txt", limit=2001)
    assert is_error
    assert "between 1 and 2000" in text
    assert BUILTINS["read"].parameters["properties"]["limit"]["maximum"] == 2000


def test_no_continuation_line_at_the_end(tree: Tree, call: Call) -> None:
    """When no more lines follow, there is no continuation line."""
    _lines(tree.data / "a.txt", 4)
    assert "more lines" not in call("read", path="a.txt", offset=3, limit=2)[0]


def test_a_line_over_4000_characters_is_cut_and_marked(tree: Tree, call: Call) -> None:
    """A line longer than 4000 characters keeps 4000 and is marked [line truncated]."""
    (tree.data / "a.txt").write_text("é" * 4001 + "\nnext\n")
    lines = call("read", path="a.txt")[0].splitlines()
    assert lines[0] == "1\t" + "é" * 4000 + " [line truncated]"
    assert lines[1] == "2\tnext"


def test_a_line_of_exactly_4000_characters_is_whole(tree: Tree, call: Call) -> None:
    """A line of exactly 4000 characters is shown unmarked."""
    (tree.data / "a.txt").write_text("x" * 4000 + "\n")
    assert call("read", path="a.txt")[0] == "1\t" + "x" * 4000


def test_a_huge_line_is_cut_without_reading_it_into_memory(tree: Tree, call: Call) -> None:
    """A 20 MB line is cut, and the lines after it still come back."""
    with (tree.data / "a.txt").open("w") as f:
        f.write("y" * 20_000_000 + "\nafter\n")
    lines = call("read", path="a.txt")[0].splitlines()
    assert lines[0].endswith(" [line truncated]")
    assert lines[1] == "2\tafter"


def test_relative_and_absolute_paths_agree(tree: Tree, call: Call) -> None:
    """A path relative to the workdir and the same path absolute read the same file."""
    (tree.data / "sub").mkdir()
    (tree.data / "sub" / "a.txt").write_text("same\n")
    assert call("read", path="sub/a.txt") == call("read", path=str(tree.data / "sub" / "a.txt"))


def test_crlf_line_endings_are_dropped(tree: Tree, call: Call) -> None:
    """Windows line endings do not leave a carriage return in the text."""
    (tree.data / "a.txt").write_bytes(b"one\r\ntwo\r\n")
    assert call("read", path="a.txt")[0] == "1\tone\n2\ttwo"


def test_last_line_without_newline_is_read(tree: Tree, call: Call) -> None:
    """A file whose last line has no newline still shows that line."""
    (tree.data / "a.txt").write_bytes(b"one\ntwo")
    assert call("read", path="a.txt")[0] == "1\tone\n2\ttwo"


def test_offset_past_the_end_is_an_error_naming_the_length(tree: Tree, call: Call) -> None:
    """An offset beyond the last line says how many lines there are."""
    (tree.data / "a.txt").write_bytes(b"one\ntwo")
    text, is_error = call("read", path="a.txt", offset=9)
    assert is_error
    assert "has 2 lines" in text


def test_empty_file_says_so(tree: Tree, call: Call) -> None:
    """An empty file is not an error, and the model is told it is empty."""
    (tree.data / "a.txt").write_bytes(b"")
    text, is_error = call("read", path="a.txt")
    assert not is_error
    assert "is empty" in text


def test_invalid_utf8_is_replaced(tree: Tree, call: Call) -> None:
    """Bytes that are not UTF-8 show as replacement characters, not an error."""
    (tree.data / "a.txt").write_bytes(b"caf\xe9\n")
    assert call("read", path="a.txt") == ("1\tcaf\ufffd", False)


def test_a_directory_is_a_clear_error(tree: Tree, call: Call) -> None:
    """Reading a directory points the model to list."""
    (tree.data / "sub").mkdir()
    text, is_error = call("read", path="sub")
    assert is_error
    assert "is a directory" in text
    assert "list" in text


def test_a_binary_file_is_a_clear_error(tree: Tree, call: Call) -> None:
    """A NUL byte in the first 8 KiB makes a file binary, which read refuses."""
    (tree.data / "a.bin").write_bytes(b"x" * 8000 + b"\x00")
    text, is_error = call("read", path="a.bin")
    assert is_error
    assert "binary" in text


def test_a_nul_after_8_kib_is_not_binary(tree: Tree, call: Call) -> None:
    """Only the first 8 KiB decide whether a file is binary."""
    (tree.data / "a.txt").write_bytes(b"x" * 8192 + b"\x00\n")
    assert not call("read", path="a.txt")[1]


def test_a_fifo_is_refused_without_blocking(tree: Tree, call: Call) -> None:
    """A named pipe with no writer is refused at once instead of blocking the worker."""
    os.mkfifo(tree.data / "pipe")
    text, is_error = call("read", path="pipe")
    assert is_error
    assert "FIFO" in text


def test_a_device_is_refused(tree: Tree, call: Call) -> None:
    """A character device node is refused and never opened."""
    os.mknod(tree.data / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    text, is_error = call("read", path="zero")
    assert is_error
    assert "character device" in text


def test_a_socket_is_refused(tree: Tree, call: Call) -> None:
    """A socket file is refused."""
    sock = socket.socket(socket.AF_UNIX)
    cwd = Path.cwd()
    try:
        os.chdir(tree.data)  # a relative bind keeps the socket path short
        sock.bind("sock")
    finally:
        os.chdir(cwd)
        sock.close()
    text, is_error = call("read", path="sock")
    assert is_error
    assert "socket" in text


def test_a_missing_file_is_a_clear_error(tree: Tree, call: Call) -> None:
    """A missing file names the path that does not exist."""
    text, is_error = call("read", path="nope.txt")
    assert is_error
    assert text == f"{tree.data}/nope.txt does not exist."


def test_path_is_required(tree: Tree, call: Call) -> None:
    """read without a path says what to give."""
    text, is_error = call("read")
    assert is_error
    assert "path is required" in text


def test_reading_near_the_end_of_a_huge_file_does_not_load_it(tree: Tree) -> None:
    """Lines after a 256 MiB stretch come back with the address space capped far below the file
    (at a quarter of it: reading 1 GiB under 256 MiB proved the same in 5 s of a loaded run)."""
    big = tree.data / "big.txt"
    with big.open("wb") as f:
        f.write(b"head\n" * 2000)  # text first: binary detection looks at 8 KiB only
        f.truncate(256 << 20)  # a sparse hole of NULs: one huge line, no disk space
        f.seek(256 << 20)
        f.write(b"\ntail 1\ntail 2\n")
    # The server package alone (its folder is a namespace package), without the library.
    sandbox_dir = Path(_files.__file__).parent.parent
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (64 << 20, 64 << 20))
        sys.path.insert(0, {str(sandbox_dir)!r})
        from server import _files as files
        ctx = files.FileContext({str(tree.data)!r}, [{str(tree.data)!r}])
        print(files.handle("lines", {{"path": "big.txt", "offset": 2002}}, ctx))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "('2002\\ttail 1\\n2003\\ttail 2', False)"


@pytest.mark.parametrize("value", [0, -1])
def test_offset_below_one_is_refused(tree: Tree, call: Call, value: int) -> None:
    """Lines count from 1, so a smaller offset is the model's mistake."""
    _lines(tree.data / "a.txt", 3)
    assert call("read", path="a.txt", offset=value)[1]
