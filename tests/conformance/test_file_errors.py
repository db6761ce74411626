"""The file primitives' whole error table, as their docstrings and docs/exec-and-files.md give it.

Each row puts something in the way (a folder, a link, a dangling link, a FIFO, a
socket, /proc, a mount point, a read-only mount, a mode the calls' user may not
use) and checks the one error each primitive raises, its errno and that its
message names the sandbox path. The turn goes on after every refusal.
"""

from __future__ import annotations

import errno

from astralvessel import (
    SandboxFileError,
    SandboxFileNotFoundError,
    SandboxIsADirectoryError,
    SandboxNotADirectoryError,
    SandboxPermissionError,
    Turn,
)

#: Made by a call before each row: every kind of thing a path can meet.
SETUP = (
    "cd /workspace && mkdir dir && echo x > file && ln -s file link && ln -s absent dangling"
    " && ln -s dir dirlink && mkfifo fifo"
    # A socket file as mknod makes one (calls may not open AF_UNIX sockets by default).
    " && python3 -c \"import os, stat; os.mknod('sock', stat.S_IFSOCK | 0o600)\""
    " && echo s > locked && chmod 000 locked && mkdir closed && chmod 000 closed"
    " && mkdir shut && chmod 555 shut && echo r > readonly && chmod 444 readonly"
)

Row = tuple[str, str, type[OSError], int]

#: (primitive, path, error, errno): read_file, write_file, list_dir on each thing.
TABLE: list[Row] = [
    # A folder where a file should be, and the reverse.
    ("read", "/workspace", SandboxIsADirectoryError, errno.EISDIR),
    ("write", "/workspace", SandboxIsADirectoryError, errno.EISDIR),
    ("write", "/workspace/dir", SandboxIsADirectoryError, errno.EISDIR),
    ("write", "/data", SandboxIsADirectoryError, errno.EISDIR),
    ("write", "/usr", SandboxIsADirectoryError, errno.EISDIR),
    ("read", "/workspace/dir", SandboxIsADirectoryError, errno.EISDIR),
    ("list", "/workspace/file", SandboxNotADirectoryError, errno.ENOTDIR),
    ("read", "/workspace/file/x", SandboxNotADirectoryError, errno.ENOTDIR),
    ("write", "/workspace/file/x", SandboxNotADirectoryError, errno.ENOTDIR),
    # Links: followed inside the agent's data for reads, never at a written name.
    ("write", "/workspace/link", SandboxFileError, errno.ELOOP),
    ("write", "/workspace/dangling", SandboxFileError, errno.ELOOP),
    ("write", "/workspace/dirlink", SandboxFileError, errno.ELOOP),
    ("read", "/workspace/dangling", SandboxFileNotFoundError, errno.ENOENT),
    ("list", "/workspace/dangling", SandboxFileNotFoundError, errno.ENOENT),
    # A FIFO and a socket are not files (and a read never blocks on the FIFO).
    ("read", "/workspace/fifo", SandboxFileError, errno.EINVAL),
    ("write", "/workspace/fifo", SandboxFileError, errno.EINVAL),
    ("list", "/workspace/fifo", SandboxNotADirectoryError, errno.ENOTDIR),
    ("read", "/workspace/sock", SandboxFileError, errno.EINVAL),
    ("write", "/workspace/sock", SandboxFileError, errno.EINVAL),
    # Outside the agent's data: /proc, /sys, the root.
    ("read", "/proc/self/status", SandboxPermissionError, errno.EACCES),
    ("list", "/proc", SandboxPermissionError, errno.EACCES),
    ("write", "/proc/self/comm", SandboxPermissionError, errno.EACCES),
    ("list", "/", SandboxPermissionError, errno.EACCES),
    ("write", "/sys/x", SandboxPermissionError, errno.EACCES),
    # Read-only places: the data mount, its files, a system folder.
    ("write", "/data/species.txt", SandboxPermissionError, errno.EACCES),
    ("write", "/data/new/deeper.txt", SandboxPermissionError, errno.EACCES),
    ("write", "/usr/bin/new", SandboxPermissionError, errno.EACCES),
    # Modes the calls' user may not use.
    ("read", "/workspace/locked", SandboxPermissionError, errno.EACCES),
    ("list", "/workspace/closed", SandboxPermissionError, errno.EACCES),
    ("read", "/workspace/closed/x", SandboxPermissionError, errno.EACCES),
    ("write", "/workspace/shut/x", SandboxPermissionError, errno.EACCES),
    ("write", "/workspace/readonly", SandboxPermissionError, errno.EACCES),
    # Missing.
    ("read", "/workspace/absent", SandboxFileNotFoundError, errno.ENOENT),
    ("list", "/workspace/absent", SandboxFileNotFoundError, errno.ENOENT),
    ("read", "/workspace/absent/x", SandboxFileNotFoundError, errno.ENOENT),
]


def _primitive(turn: Turn, op: str, path: str) -> object:
    if op == "read":
        return turn.read_file(path)
    if op == "write":
        return turn.write_file(path, b"planted")
    return turn.list_dir(path)


def test_the_error_table_holds(turn: Turn):
    """Each row raises exactly its error and errno, naming the path, and changes nothing."""
    made = turn.exec(["sh", "-c", SETUP])
    assert made.returncode == 0, made.stderr
    wrong = []
    for op, path, error, code in TABLE:
        try:
            _primitive(turn, op, path)
        except SandboxFileError as caught:
            # Each is also the builtin a harness catches (an OSError), with strerror set.
            got = (type(caught), caught.errno, caught.filename, bool(caught.strerror))
            if got != (error, code, path, True):
                wrong.append((op, path, type(caught).__name__, caught.errno, str(caught)))
        else:
            wrong.append((op, path, "no error"))
    assert wrong == []
    # Nothing was written where a refusal stood, and the FIFO never blocked a worker.
    assert turn.exec(["cat", "/workspace/readonly"]).stdout == b"r\n"
    assert turn.exec(["test", "-p", "/workspace/fifo"]).returncode == 0
    assert turn.read_file("/workspace/link") == b"x\n"
    assert turn.list_dir("/workspace/dirlink") == []
