"""``Turn.read_file``, ``write_file`` and ``list_dir``: confined like the built-in file tools."""

from __future__ import annotations

import concurrent.futures
import errno
import os

import attrs
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
    Turn,
)
from astralvessel._executor import _exec as exec_module

from .conftest import TEST_LIMITS


def test_binary_round_trip(turn: Turn):
    """Every byte value written comes back unchanged, and a call reads the same bytes."""
    data = bytes(range(256)) * 16 + os.urandom(1024)
    turn.write_file("/workspace/blob.bin", data)
    assert turn.read_file("/workspace/blob.bin") == data
    assert turn.exec(["cat", "/workspace/blob.bin"]).stdout == data


def test_file_larger_than_one_chunk_round_trips(turn: Turn):
    """A file of two chunks and a bit (relative to the workspace) comes back whole."""
    data = os.urandom(2 * exec_module.CHUNK_BYTES + 12345)
    turn.write_file("/workspace/big.bin", data)
    assert turn.read_file("/workspace/big.bin") == data
    assert (
        turn.exec(["wc", "-c", "/workspace/big.bin"]).stdout.split()[0] == str(len(data)).encode()
    )


def test_text_is_written_as_utf8(turn: Turn):
    """Text data is written as UTF-8, replacing what was there."""
    turn.write_file("/workspace/note.txt", "a much longer first version\n")
    turn.write_file("/workspace/note.txt", "héron\n")
    assert turn.read_file("/workspace/note.txt") == "héron\n".encode()


def test_read_past_the_bound_is_refused(turn: Turn, monkeypatch: pytest.MonkeyPatch):
    """A file larger than the bound raises FileTooLargeError, an OSError with EFBIG."""
    assert turn.exec(["sh", "-c", "head -c 5000 /dev/zero > /workspace/five"]).returncode == 0
    monkeypatch.setattr(exec_module, "FILE_BYTES", 4096)
    with pytest.raises(FileTooLargeError) as caught:
        turn.read_file("/workspace/five")
    assert isinstance(caught.value, OSError)


def test_missing_file_is_file_not_found(turn: Turn):
    """A missing file, or a missing folder on the way, raises FileNotFoundError."""
    with pytest.raises(SandboxFileNotFoundError) as caught:
        turn.read_file("/workspace/absent.txt")
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.filename == "/workspace/absent.txt"
    with pytest.raises(FileNotFoundError):
        turn.read_file("/workspace/nowhere/absent.txt")


def test_folder_is_a_directory_error(turn: Turn):
    """Reading or writing a folder raises IsADirectoryError."""
    with pytest.raises(SandboxIsADirectoryError):
        turn.read_file("/workspace")
    assert turn.exec(["mkdir", "/workspace/folder"]).returncode == 0
    with pytest.raises(IsADirectoryError):
        turn.write_file("/workspace/folder", b"x")


def test_file_in_the_way_is_not_a_directory(turn: Turn):
    """A file where a folder should be raises NotADirectoryError, for a read and for a write."""
    turn.write_file("/workspace/plain", b"x")
    with pytest.raises(SandboxNotADirectoryError):
        turn.write_file("/workspace/plain/inner", b"y")
    with pytest.raises(NotADirectoryError):
        turn.read_file("/workspace/plain/inner")


def test_unreadable_file_is_permission_error(turn: Turn):
    """A file its mode makes unreadable to the calls' user raises PermissionError."""
    assert (
        turn.exec(
            ["sh", "-c", "echo s > /workspace/locked; chmod 000 /workspace/locked"]
        ).returncode
        == 0
    )
    with pytest.raises(SandboxPermissionError):
        turn.read_file("/workspace/locked")


@pytest.mark.parametrize(
    "path",
    [
        "/data/new.txt",
        "/data/species.txt",
        "/etc/passwd",
        "/usr/bin/new",
        "/agent/x",
        "/tmp/x",
        "/x",
    ],
)
def test_writes_outside_the_writable_places_are_refused(turn: Turn, path: str):
    """Writes to read-only mounts, system folders, the agent folder or outside the view are refused."""
    before = turn.exec(["cat", "/data/species.txt"]).stdout
    with pytest.raises(SandboxPermissionError) as caught:
        turn.write_file(path, b"planted")
    assert isinstance(caught.value, PermissionError)
    assert turn.exec(["cat", "/data/species.txt"]).stdout == before
    assert turn.exec(["test", "-e", path]).returncode != 0 or path in (
        "/etc/passwd",
        "/data/species.txt",
    )


@pytest.mark.parametrize(
    "path", ["/proc/self/environ", "/proc/1/cmdline", "/sys/kernel/notes", "/root/x"]
)
def test_read_outside_the_agent_data_is_refused(turn: Turn, path: str):
    """Reads outside the visible roots are refused with PermissionError, as the read tool refuses them."""
    with pytest.raises(SandboxPermissionError):
        turn.read_file(path)


def test_link_at_the_name_is_never_followed(turn: Turn):
    """A link planted at the written name is refused, whether it leads inside or outside."""
    script = (
        "ln -s /etc/hostname /workspace/out; echo in > /workspace/real; ln -s real /workspace/in"
    )
    assert turn.exec(["sh", "-c", script]).returncode == 0
    for name in ("/workspace/out", "/workspace/in"):
        with pytest.raises(SandboxFileError):
            turn.write_file(name, b"through the link")
    assert turn.read_file("/workspace/real") == b"in\n"


def test_linked_folder_cannot_lead_a_write_outside(turn: Turn):
    """A folder link out of the workspace cannot carry a write or a read beyond the rules."""
    script = (
        "ln -s /etc /workspace/etc; ln -s /proc/self /workspace/me; ln -s /data /workspace/data"
    )
    assert turn.exec(["sh", "-c", script]).returncode == 0
    with pytest.raises(SandboxPermissionError):
        turn.write_file("/workspace/etc/planted", b"x")
    with pytest.raises(SandboxPermissionError):
        turn.write_file("/workspace/data/planted", b"x")
    with pytest.raises(SandboxPermissionError):
        turn.read_file("/workspace/me/environ")
    with pytest.raises(SandboxPermissionError):
        turn.write_file("/workspace/a/../../etc/planted", b"x")
    # Reading through a link that stays within the agent's data is as the read tool allows.
    assert turn.read_file("/workspace/data/species.txt") == b"otter\nheron\n"


@pytest.mark.parametrize(
    "name",
    [
        "with space",
        "new\nline",
        "-rf",
        "quote'\"",
        "ünïcødé ✓",
        "star*?[x]",
        "$(reboot)",
        ".hidden",
        "a" * 255,
    ],
)
def test_hostile_names_round_trip(turn: Turn, name: str):
    """Names a shell would mangle are written and read as the very file named."""
    turn.write_file(f"/workspace/{name}", name.encode())
    assert turn.read_file(f"/workspace/{name}") == name.encode()
    listed = dict(turn.list_dir("/workspace"))
    assert listed[name] == "file"


def test_too_long_name_is_refused(turn: Turn):
    """A name past the file system's limit is refused with an OSError, and the turn goes on."""
    with pytest.raises(SandboxFileError):
        turn.write_file("/workspace/" + "a" * 300, b"x")
    assert turn.exec(["true"]).returncode == 0


def test_written_file_belongs_to_the_calls(turn: Turn):
    """A call can append to a file the host wrote, and the host reads what the call added."""
    turn.write_file("/workspace/log.txt", "first\n")
    assert turn.exec(["sh", "-c", "echo second >> /workspace/log.txt"]).returncode == 0
    assert turn.read_file("/workspace/log.txt") == b"first\nsecond\n"


def test_list_dir_names_entries_and_kinds(turn: Turn):
    """list_dir gives each entry's name and kind, in name order; relative paths start at the workdir."""
    script = "cd /workspace && mkdir d && echo x > f && ln -s f l && mkfifo p"
    assert turn.exec(["sh", "-c", script]).returncode == 0
    listed = turn.list_dir("/workspace")
    assert [e for e in listed if e[0] in {"d", "f", "l", "p"}] == [
        ("d", "dir"),
        ("f", "file"),
        ("l", "link"),
        ("p", "other"),
    ]
    assert turn.list_dir() == [("species.txt", "file")]


def test_parents_are_made_inside_the_workspace_only(turn: Turn):
    """Missing folders are made on the way to a written file, and only where writes may go."""
    turn.write_file("/workspace/deep/er/file.txt", b"x")
    assert turn.exec(["cat", "/workspace/deep/er/file.txt"]).stdout == b"x"
    with pytest.raises(SandboxPermissionError):
        turn.write_file("/data/made/file.txt", b"x")
    assert turn.exec(["test", "-e", "/data/made"]).returncode != 0


def test_writable_root_opens_the_root_to_writes(backend):
    """With the writable-root relaxation, write_file reaches the root's folders as calls do."""
    executor = Executor(
        Registry(),
        sandbox=backend,
        writable_root=True,
        limits=attrs.evolve(TEST_LIMITS, disk_mb=64),
    )
    with executor, executor.turn() as turn:
        for path in ("/tmp/notes/a.txt", "/usr/local/bin/helper", "/etc/harness.conf"):
            turn.write_file(path, path.encode())
            assert turn.exec(["cat", path]).stdout == path.encode()
        with pytest.raises(SandboxPermissionError):
            turn.write_file("/proc/planted", b"x")


# Swaps /workspace/race/x between a plain file and links out of the agent's data, and the link
# /workspace/race/d between a plain folder inside and /proc, each by one atomic rename, as fast
# as it can, until the host leaves /workspace/race/stop.
_SWAPPER = r"""
import os, time
os.chdir("/workspace/race")
open("x", "w").write("plain\n")
os.mkdir("inside")
open("inside/version", "w").write("plain\n")
os.symlink("inside", "d")
open("up", "w").close()
end = time.monotonic() + 20  # a backstop: the host says stop, or closes the turn


def swap(make, name):
    if os.path.lexists(name + ".new"):
        os.unlink(name + ".new")
    make(name + ".new")
    os.rename(name + ".new", name)


def plain(path):
    with open(path, "w") as f:
        f.write("plain\n")


while not os.path.exists("stop") and time.monotonic() < end:
    # Targets the calls' user may read, outside the agent's data: only the rules keep them out.
    for target in ("/proc/version", "/proc/self/status", "/proc/cpuinfo"):
        swap(lambda new: os.symlink(target, new), "x")
        swap(plain, "x")
        swap(lambda new: os.symlink("/proc", new), "d")
        swap(lambda new: os.symlink("inside", new), "d")
print("swapped")
"""


def test_links_swapped_under_file_operations_never_lead_outside(turn: Turn):
    """A call swapping names for links out of the agent's data meanwhile: files stay inside."""
    assert turn.exec(["mkdir", "/workspace/race"]).returncode == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        swapping = pool.submit(turn.exec, ["python3", "-c", _SWAPPER], timeout=90)
        try:
            while "up" not in dict(turn.list_dir("/workspace/race")):
                assert not swapping.done(), swapping.result()
            seen: set[object] = set()
            try:
                # At least 100 rounds, and on until both states were met (the swapper's pace varies).
                for done in range(3000):
                    if done >= 100 and b"plain\n" in seen and SandboxPermissionError in seen:
                        break
                    for op in (
                        lambda: turn.read_file("/workspace/race/x"),
                        lambda: turn.read_file("/workspace/race/d/version"),
                        lambda: turn.list_dir("/workspace/race/d"),
                        lambda: turn.write_file("/workspace/race/d/version", b"plain\n"),
                    ):
                        try:
                            got = op()
                        except SandboxFileError as refused:
                            got = type(refused)
                        seen.add(tuple(got) if isinstance(got, list) else got)
            finally:
                turn.write_file("/workspace/race/stop", b"")
            swapped = swapping.result()
            assert swapped.stdout == b"swapped\n", swapped.stderr
        except BaseException:
            # A file primitive that fails cannot tell the swapper to stop (docker-exec has
            # none): closing the turn ends it, so the failure shows now, not at its deadline.
            turn.close()
            raise
    # The race ran: the same names were seen plain and refused as links out.
    assert b"plain\n" in seen, seen
    assert SandboxPermissionError in seen, seen
    # Contents read are the call's own plain files; a listing names only the plain folder's.
    allowed = {b"plain\n", None, (("version", "file"),)}
    assert {s for s in seen if not isinstance(s, type)} <= allowed, seen
    assert {s for s in seen if isinstance(s, type)} <= {
        SandboxFileNotFoundError,
        SandboxPermissionError,
        SandboxIsADirectoryError,
        SandboxNotADirectoryError,
        SandboxFileError,
    }


def test_write_past_the_disk_leaves_the_file_empty_and_room(turn: Turn):
    """A write the disk cannot hold raises, leaves the file empty, and the workspace has room."""
    over = (TEST_LIMITS.disk_mb + 4) << 20
    with pytest.raises(SandboxFileError) as refused:
        turn.write_file("/workspace/huge.bin", b"z" * over)
    assert refused.value.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    assert turn.read_file("/workspace/huge.bin") == b""
    turn.write_file("/workspace/after.bin", b"y" * (4 << 20))
    assert turn.read_file("/workspace/after.bin") == b"y" * (4 << 20)
