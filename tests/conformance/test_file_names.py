"""Any name a call can make, the file primitives reach: lossless names, no silent cuts.

A model can make files with any byte string as a name. ``list_dir`` gives each
name as ``os.listdir`` would (``os.fsdecode``'s escapes for bytes that are not
UTF-8), and that very string reaches the same file through ``read_file``,
``write_file`` and ``list_dir``, on every hop from the host to the sandbox's
file worker. A folder larger than the listing says so.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel import Agent, Executor, Listing, Registry, SandboxFileError, Turn, UsageError
from astralvessel.sandbox import Mount
from astralvessel.sandbox.server._files import LIST_MAX_ENTRIES, LIST_SCAN_ENTRIES

from .conftest import TEST_LIMITS, WORKDIR


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    """The conformance agent, with the built-in file tools as well as bash."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "vessel.toml").write_text(
        'name = "names"\nworkdir = "/data"\n\n[tools]\n'
        'builtin = ["bash", "read", "list", "glob", "grep"]\n'
    )
    for path in (tmp_path, agent):
        path.chmod(0o755)
    return agent


#: Names as bytes, each made by a call: not UTF-8, an encoded surrogate, controls, ANSI.
HOSTILE_NAMES = [
    b"\xff\xfe",
    b"caf\xe9",
    b"\xed\xa0\x80",
    b"\x80" * 255,
    b"new\nline\r",
    b"\x1b[31mred\x1b[0m\x07",
    b"tab\there",
    "ünïcødé ✓".encode(),
    b"..." + b"\xc3",
]


def _make(turn: Turn, folder: bytes, names: list[bytes]) -> None:
    """Create each named file in ``folder`` from inside the sandbox, holding its own name."""
    script = (
        "import os,sys\n"
        "d=os.fsencode(sys.argv[1])\n"
        "os.makedirs(d,exist_ok=True)\n"
        "for n in sys.argv[2:]:\n"
        "    b=os.fsencode(n)\n"
        "    with open(os.path.join(d,b),'wb') as f: f.write(b)\n"
    )
    argv = ["python3", "-c", script, os.fsdecode(folder), *map(os.fsdecode, names)]
    result = turn.exec(argv)
    assert result.returncode == 0, result.stderr


def test_listed_names_reach_the_same_files(turn: Turn):
    """Every name list_dir gives, however hostile, reads, writes and lists the very file."""
    _make(turn, b"/workspace/\xffodd", HOSTILE_NAMES)
    folders = [name for name, kind in turn.list_dir("/workspace") if kind == "dir"]
    folder = next(name for name in folders if os.fsencode(name) == b"\xffodd")
    listed = turn.list_dir(f"/workspace/{folder}")
    assert sorted(os.fsencode(name) for name, _ in listed) == sorted(HOSTILE_NAMES)
    for name, kind in listed:
        assert kind == "file"
        path = f"/workspace/{folder}/{name}"
        assert turn.read_file(path) == os.fsencode(name)
        turn.write_file(path, b"rewritten " + os.fsencode(name))
        seen = turn.exec(["cat", "--", path])
        assert seen.stdout == b"rewritten " + os.fsencode(name)


def test_host_names_arrive_as_their_bytes(turn: Turn):
    """A name the host builds with os.fsdecode is created with exactly those bytes."""
    raw = b"/workspace/made\xff\xfe\x01"
    turn.write_file(os.fsdecode(raw), b"x")
    shown = turn.exec(["python3", "-c", "import os;print(os.listdir(b'/workspace'))"])
    assert b"b'made\\xff\\xfe\\x01'" in shown.stdout
    assert (os.fsdecode(b"made\xff\xfe\x01"), "file") in turn.list_dir("/workspace")


def test_commands_reach_files_of_any_name_through_their_arguments(turn: Turn):
    """A name of any bytes, given to commands as an argument, makes and reads that very file."""
    for raw in HOSTILE_NAMES:
        path = os.fsdecode(b"/workspace/" + raw)
        made = turn.exec(["sh", "-c", 'printf "%s" "$1" > "$1"', "sh", path])
        assert made.returncode == 0, made.stderr
        assert turn.exec(["cat", "--", path]).stdout == b"/workspace/" + raw
    listed = turn.exec(
        ["find", "/workspace", "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0"]
    )
    assert set(HOSTILE_NAMES) <= set(listed.stdout.split(b"\0"))


@pytest.mark.parametrize(
    "path", ["/workspace/" + chr(0xD800), "/workspace/a" + chr(0xDFFF), chr(0xDC7F)]
)
def test_a_surrogate_no_byte_stands_for_is_a_usage_error(turn: Turn, path: str):
    """A str no file name decodes to is the host's mistake: UsageError, and nothing is sent."""
    with pytest.raises(UsageError, match="surrogate"):
        turn.read_file(path)
    with pytest.raises(UsageError, match="surrogate"):
        turn.write_file(path, b"x")
    with pytest.raises(UsageError, match="surrogate"):
        turn.list_dir(path)
    assert turn.exec(["true"]).returncode == 0


@pytest.mark.parametrize("path", ["/workspace/a\0b", "\0", ""])
def test_nul_and_empty_paths_are_usage_errors(turn: Turn, path: str):
    """NUL anywhere, or no path at all, raises UsageError for each primitive."""
    for call in (turn.read_file, turn.list_dir, lambda p: turn.write_file(p, b"x")):
        with pytest.raises(UsageError):
            call(path)


def test_name_lengths_are_the_kernels(turn: Turn):
    """255 bytes (in two-byte characters too) is a name; 256 bytes is ENAMETOOLONG, clearly."""
    for name in ("b" * 255, "é" * 127 + "c", os.fsdecode(b"\xfe" * 255)):
        turn.write_file(f"/workspace/{name}", name.encode("utf-8", "surrogateescape"))
        assert (name, "file") in turn.list_dir("/workspace")
    for name in ("b" * 256, "é" * 128):
        with pytest.raises(SandboxFileError) as caught:
            turn.write_file(f"/workspace/{name}", b"x")
        assert caught.value.errno == errno.ENAMETOOLONG
        assert "too long" in str(caught.value)
        with pytest.raises(SandboxFileError) as caught:
            turn.read_file(f"/workspace/{name}")
        assert caught.value.errno == errno.ENAMETOOLONG


def test_dot_dot_names_a_folder_not_a_file(turn: Turn):
    """A write to a path ending in '..' or '.' is IsADirectoryError; '..' never climbs out."""
    for path in ("/workspace/..", "/workspace/.", "/workspace/sub/.."):
        with pytest.raises(IsADirectoryError):
            turn.write_file(path, b"x")
    with pytest.raises(PermissionError):
        turn.write_file("/workspace/../escape", b"x")
    with pytest.raises(PermissionError):
        turn.list_dir("/workspace/../..")


def test_a_listing_past_its_limit_says_it_was_cut(turn: Turn):
    """list_dir returns a Listing; past ``limit`` it holds that many and says truncated."""
    names = [f"n{i:03}".encode() for i in range(30)]
    _make(turn, b"/workspace/many", names)
    whole = turn.list_dir("/workspace/many")
    assert isinstance(whole, Listing)
    assert not whole.truncated
    assert whole == [(name.decode(), "file") for name in names]
    cut = turn.list_dir("/workspace/many", limit=10)
    assert cut.truncated
    assert len(cut) == 10
    assert cut == sorted(cut)
    assert set(cut) <= set(whole)
    exact = turn.list_dir("/workspace/many", limit=30)
    assert not exact.truncated
    assert exact == whole


@pytest.mark.parametrize("limit", [0, -1, 10_001, True, 2.5, "10"])
def test_a_bad_limit_is_a_usage_error(turn: Turn, limit: object):
    """limit is a number of entries from 1 to 10 000."""
    with pytest.raises(UsageError, match="limit"):
        turn.list_dir("/workspace", limit=limit)  # type: ignore[arg-type]


def test_a_folder_past_ten_thousand_entries_is_never_cut_silently(
    backend, agent_dir: Path, data_dir: Path
):
    """A folder of 20 000 entries of 255-byte names lists 10 000 of them and says it was cut."""
    # Each entry is an inode, and the workspace's inodes scale with its disk bound.
    executor = Executor(
        Registry.for_agent(Agent.load(agent_dir)),
        sandbox=backend,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        limits=attrs.evolve(TEST_LIMITS, disk_mb=64),
        timeout_seconds=120.0,
    )
    script = (
        "import os\n"
        "os.mkdir('/workspace/huge')\n"
        "os.chdir('/workspace/huge')\n"
        "for i in range(20000):\n"
        "    os.close(os.open('%05d' % i + 'x' * 250, os.O_CREAT | os.O_WRONLY, 0o644))\n"
    )
    with executor, executor.turn() as turn:
        made = turn.exec(["python3", "-c", script])
        assert made.returncode == 0, made.stderr
        listed = turn.list_dir("/workspace/huge")
        assert listed.truncated
        assert len(listed) == 10_000
        assert all(len(name) == 255 and kind == "file" for name, kind in listed)
        assert len(turn.list_dir("/workspace/huge", limit=1)) == 1


#: Entries in the crowded folder: just past the list tool's reading bound, which is what the
#: note proves (a folder of 200 000 took 30 s to make on a loaded host and proved no more).
CROWD = LIST_SCAN_ENTRIES + 50


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Data holding a folder of ``CROWD`` empty files, made once for every backend."""
    data = tmp_path_factory.mktemp("crowded")
    folder = data / "crowd"
    folder.mkdir()
    for n in range(CROWD):
        os.mknod(folder / f"n{n:06}")
    for path in (data, folder):
        path.chmod(0o755)
    yield data
    shutil.rmtree(data)


def test_the_list_tool_reads_a_crowded_folder_only_to_its_bound(
    backend, agent_dir: Path, crowded: Path
):
    """The model's list of a folder past the reading bound shows 500 names and says it stopped."""
    executor = Executor(
        Registry.for_agent(Agent.load(agent_dir)),
        sandbox=backend,
        mounts=(Mount.from_pair(WORKDIR, crowded),),
        limits=TEST_LIMITS,
        timeout_seconds=30.0,
    )
    with executor, executor.turn() as turn:
        result = turn.call("list", {"path": "crowd"})
        assert not result.is_error, result.text
        *names, note = result.text.splitlines()
        assert len(names) == LIST_MAX_ENTRIES
        assert all(name.startswith("n") for name in names)
        assert names == sorted(names)
        assert note.startswith(f"[this folder holds more than {LIST_SCAN_ENTRIES} entries")
        assert turn.call("list", {}).text == "crowd/"


@pytest.mark.parametrize("tool", ["read", "list", "glob", "grep"])
def test_builtin_tools_act_on_hostile_names(turn: Turn, tool: str):
    """Each built-in file tool answers on a folder of hostile names, and the turn goes on."""
    _make(turn, b"/workspace/odd", HOSTILE_NAMES)
    arguments = {
        "read": {"path": "/workspace/odd/\x1b[31mred\x1b[0m\x07"},
        "list": {"path": "/workspace/odd"},
        "glob": {"pattern": "**", "path": "/workspace/odd"},
        "grep": {"pattern": "a", "path": "/workspace/odd"},
    }[tool]
    result = turn.call(tool, json.dumps(arguments))
    assert not result.is_error, result.text
    result.text.encode("utf-8")  # valid Unicode, whatever the names held
    assert turn.exec(["true"]).returncode == 0


#: Paths no tool can take as they are: lone surrogates, a NUL, a climb, an overlong name, and
#: a terminal control.
HOSTILE_PATHS = (
    chr(0xD800),
    "a" + chr(0xDFFF),
    "x\0y",
    chr(0xDCFF),
    "../" * 200,
    "é" * 300,
    "\x1b[2J",
)


@pytest.mark.parametrize("tool", ["read", "list", "glob", "grep"])
def test_builtin_tools_refuse_hostile_paths_as_results(turn: Turn, tool: str):
    """A hostile path gives the model a result it can act on, never a broken turn (the paths
    share one turn: each must leave it working for the next)."""
    for path in HOSTILE_PATHS:
        arguments: dict[str, object] = {"path": path}
        if tool in ("glob", "grep"):
            arguments["pattern"] = "a"
        result = turn.call(tool, json.dumps(arguments))
        result.text.encode("utf-8")
        assert result.text, path
        assert turn.exec(["true"]).returncode == 0, path
