"""Promises: no unix sockets or socket files, no SysV or POSIX IPC."""

from __future__ import annotations

import errno

from .calls import py, py_json


def test_af_unix_socket_refused(session):
    """``socket(AF_UNIX)`` fails with EPERM in a call; a nameless pair is allowed."""
    result = py_json(
        session,
        """
        import json, socket
        out = {}
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            try:
                socket.socket(socket.AF_UNIX, kind)
                out[str(kind)] = "created"
            except OSError as exc:
                out[str(kind)] = exc.errno
        try:
            socket.socketpair(socket.AF_UNIX)
            out["pair"] = "created"
        except OSError as exc:
            out["pair"] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result.pop("pair") == "created"
    assert set(result.values()) == {errno.EPERM}


def test_no_socket_file_in_workspace(session):
    """A call cannot bind a unix socket file, not even in its own workspace."""
    result = py_json(
        session,
        """
        import json, os, socket
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind("/workspace/sock")
            print(json.dumps("bound"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result == errno.EPERM


def test_sysv_ipc_refused(session):
    """SysV shared memory, message queues and semaphores all fail in a call."""
    result = py_json(
        session,
        """
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        IPC_PRIVATE, IPC_CREAT = 0, 0o1000
        out = {}
        for name, call in (
            ("shmget", lambda: libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600)),
            ("msgget", lambda: libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)),
            ("semget", lambda: libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)),
        ):
            out[name] = call() if call() >= 0 else -ctypes.get_errno()
        print(json.dumps(out))
        """,
    )
    assert result == {"shmget": -errno.EPERM, "msgget": -errno.EPERM, "semget": -errno.EPERM}


def test_posix_shared_memory_refused(session):
    """POSIX shared memory (``shm_open`` on /dev/shm) fails in a call."""
    result = py_json(
        session,
        """
        import json
        from multiprocessing import shared_memory
        try:
            shared_memory.SharedMemory(name="vessel-test", create=True, size=4096)
            print(json.dumps("created"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result != "created"


def test_posix_message_queue_refused(session):
    """``mq_open`` fails with EPERM in a call."""
    result = py_json(
        session,
        """
        import ctypes, ctypes.util, json, os
        librt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
        fd = librt.mq_open(b"/vessel-test", os.O_CREAT | os.O_RDWR, 0o600, None)
        print(json.dumps(fd if fd >= 0 else -ctypes.get_errno()))
        """,
    )
    assert result == -errno.EPERM


def test_dev_shm_not_writable(session):
    """Nothing in /dev/shm or /dev/mqueue can be created by a call."""
    result = py_json(
        session,
        """
        import json, os
        out = {}
        for path in ("/dev/shm/x", "/dev/mqueue/x"):
            try:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
                out[path] = "created"
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert "created" not in result.values()


def test_call_holds_no_descriptor_but_its_own_three(session):
    """A call starts with stdin, stdout and stderr open and nothing else: no pipe to the server."""
    result = py_json(
        session,
        """
        import json, os
        held = []
        for fd in range(3, 4096):
            try:
                os.fstat(fd)
            except OSError:
                continue
            held.append([fd, os.readlink(f"/proc/self/fd/{fd}")])
        print(json.dumps(held))
        """,
    )
    assert result == []


def test_call_cannot_forge_its_own_end(session):
    """A call that closes its output and writes "done" lines everywhere still runs to its timeout."""
    outcome = py(
        session,
        """
        import os, time
        os.close(1)
        os.close(2)
        for fd in range(3, 4096):
            try:
                os.write(fd, b"X0\\nD\\n")
            except OSError:
                pass
        time.sleep(30)
        """,
        timeout=1.0,
    )
    assert outcome.timed_out
    assert outcome.exit_code is None
