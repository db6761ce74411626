"""A trusted reader of frozen layers, for an ordinary user's Docker host.

A fresh Docker turn's fork freezes the workspace in place: the server holds the
tmpfs it made (``server/_heldfs``) and passes the host a detached mount of it
(``_frozen``). The host must list and hash that layer itself, never take a
sandbox's word for it; as root it reads it directly. An ordinary user cannot:
the layer's files are the turn's leased uid's (a call's ``0600`` file, the
``0700`` outbox). Its engine can, though: the host starts one container of its
own (the reader) that runs only this module's code and the file worker's
listing (``server/_snapfiles``, stdlib-only), as the container's root with no
capability but ``CAP_DAC_READ_SEARCH`` (read any file, search any folder) and,
for each fork's idmapped clone of the layer (a user namespace mapping the
parent's uid to the fork's, then ``mount_setattr``), ``CAP_SYS_ADMIN``,
``CAP_SETUID`` and ``CAP_SETGID``; no network, a read-only root,
``no-new-privileges`` and the server's seccomp profile. These are nearly a
root's powers over the host, so no model input ever runs in it: its only input
is the layer, passed by descriptor (``SCM_RIGHTS``) over a unix socket of the host's, which it
walks as the host would (every folder opened by descriptor from the one above,
nothing followed), and the host's requests.

The reply cannot be forged by a turn: the socket's folder is bound into the reader
alone, and the host takes only a connection whose peer is uid 0 (``SO_PEERCRED``:
a turn's processes are its leased uid, a user namespace of theirs maps only it).
The host then checks the listing exactly as its own (``_capture.checked_shape``:
kinds, names, links, sizes, the turn's bounds), and the layer is read-only, so
what the reader hashed is what the forks see.

Saving such a snapshot, or copying it to the store for a capture to link from, needs
its files' bytes: the reader streams them (``read``: each name of the host's manifest,
opened as for its digest, at most its size and one byte more, in pieces), and the host
writes the saved form or the copy and checks each file's size and digest as it goes.

A fork of a fork's snapshot is a stack of such layers (its own frozen upper layer over
its parent's): the reader clones each and lays their read-only overlay, detached, and
passes it back (``merged``); the host holds it as the snapshot's tree and has the
reader list and hash it as one layer. Only the reader could: the overlay reads the
layers' files with its mounter's rights, and their whiteouts may be ``trusted.*``
attributes, which only a process with ``CAP_SYS_ADMIN`` in the initial user namespace
reads.

A root host asks it for one thing too: the idmapped layer a warm sandbox adopting a
fork lays its overlay on (``_adoption`` says why the reader, not the host). That
layer is the host's read-only clone of a stored tree, made in the host's mount
namespace, which the kernel does not clone again in the reader's: never attached,
it is idmapped itself.

One reader per backend, started at its first read and reused; removed when the
backend is collected or the interpreter exits, and, where a host was killed, by
the next host's sweep (it carries a turn's labels) or at once (it ends when the
host's end of its socket closes).
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
import socket
import stat
import struct
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..server import _snapfiles
from ..server._messages import MAX_LAYERS
from ._attach import AttachChannel
from ._direct import Listener
from ._spec import CHANNEL_SOCKET, ContainerSpec, profile_text
from ._starting import Starting

__all__ = ["LayerReader", "LayerRefusedError", "ReaderFailedError", "reader_code", "reader_spec"]

#: Where the host's socket folder is bound in the reader's container.
READER_DIR = "/.astralvessel-reader"
#: A frame: the header's JSON length and the body's length, then both.
_FRAME = struct.Struct(">II")
#: The largest reply the host takes (a listing of a million names is about 150 MiB).
_MAX_REPLY = 1 << 30
#: The reader's memory bound (its listing of a million names is the most it holds).
_MEMORY = 1 << 30
#: How long one request may take (a listing or hashing of the layer).
_TIMEOUT = 300.0

_MAIN = r'''
import hashlib, json, socket, struct, sys

_FRAME = struct.Struct(">II")


class _Layer(object):
    def __init__(self, workspace, outbox):
        self.workspace = workspace
        self.outbox = outbox
        self.upper = -1


def _exact(sock, size, fds):
    data = b""
    while len(data) < size:
        chunk, ancillary, _, _ = sock.recvmsg(size - len(data), socket.CMSG_SPACE(4 * _MAX_LAYERS))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(raw) - len(raw) % 4
                fds.extend(struct.unpack("%di" % (usable // 4), raw[:usable]))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _send(sock, header, body=b""):
    text = json.dumps(header).encode()
    sock.sendall(_FRAME.pack(len(text), len(body)) + text + body)


def _digest(layer, name, size):
    # Opened folder by folder from the layer's descriptor, following no link on the way
    # (the listing's _open_file), not by path: a name is only ever the host's checked one,
    # but this process can read any file, so no name may lead it out of the layer.
    try:
        fd = _open_file(layer, name)
    except Refused as exc:
        raise OSError(exc.code, str(exc)) from None
    try:
        digest = hashlib.sha256()
        left = size
        while left:
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        if left or os.read(fd, 1):
            raise OSError(errno.EIO, "changed size while it was read")
        return digest.hexdigest()
    finally:
        os.close(fd)


def _stream(sock, layer, name, size):
    # Opened as _digest opens it (no link followed, never out of the layer). At most
    # ``size`` bytes and one more are read and sent, so a file that grew sends no more
    # than the host can refuse; the host counts and hashes what it takes.
    try:
        fd = _open_file(layer, name)
    except Refused as exc:
        raise OSError(exc.code, str(exc)) from None
    try:
        left = size + 1
        while True:
            wanted = min(_CHUNK, left)
            chunk = os.read(fd, wanted) if wanted else b""
            left -= len(chunk)
            # A short read is the file's end: it goes with the last piece (one frame for
            # a small file), else an empty end mark follows.
            end = len(chunk) < wanted or not left
            _send(sock, {"end": True} if end else {}, chunk)
            if end:
                return
    finally:
        os.close(fd)


def _syscall(what, number, *args):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, what + ": " + os.strerror(code))
    return result


def _userns(inside_uid, inside_gid, uid, gid):
    """A user namespace mapping the layer's owner (inside) to the fork's ids."""
    import ctypes
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            code = 0 if ctypes.CDLL(None).unshare(0x10000000) == 0 else 1
            os.write(ready_w, bytes([code]))
            os.read(done_r, 1)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        if os.read(ready_r, 1) != b"\0":
            raise OSError(errno.EPERM, "cannot make a user namespace")
        for name, line in (("uid_map", (inside_uid, uid)), ("gid_map", (inside_gid, gid))):
            fd = os.open("/proc/%d/%s" % (pid, name), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, ("%d %d 1\n" % line).encode())
            finally:
                os.close(fd)
        return os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(done_w)
        os.waitpid(pid, 0)


def _detached_elsewhere(layer):
    """Whether ``layer`` is a detached mount's root (no mount point of this namespace)."""
    try:
        with open("/proc/self/fdinfo/%d" % layer) as info:
            mnt_id = [line.split()[1] for line in info if line.startswith("mnt_id:")]
        with open("/proc/self/mountinfo") as mounts:
            ours = set(line.split()[0] for line in mounts)
    except (OSError, IndexError):
        return False
    return bool(mnt_id) and mnt_id[0] not in ours


def _idmapped(layer, uid, gid):
    """A detached read-only clone of ``layer`` whose owner's files show as uid/gid."""
    import ctypes
    st = os.fstat(layer)
    empty = ctypes.c_char_p(b"")
    clone = ctypes.c_uint(0x1001 | os.O_CLOEXEC)  # OPEN_TREE_CLONE | AT_EMPTY_PATH
    try:
        tree = _syscall("open_tree", 428, ctypes.c_int(layer), empty, clone)
    except OSError as exc:
        if exc.errno != 22 or not _detached_elsewhere(layer):  # EINVAL
            raise
        # A detached clone the host made in its own mount namespace (a root host's of a
        # stored tree, for one adopting sandbox), which the kernel clones nowhere else:
        # never attached, it may be idmapped itself.
        tree = os.dup(layer)
    try:
        userns = _userns(st.st_uid, st.st_gid, uid, gid)
        try:
            # MOUNT_ATTR_IDMAP | RDONLY | NOSUID | NODEV, through that namespace
            attr = ctypes.create_string_buffer(struct.pack("=QQQQ", 0x100007, 0, 0, userns), 32)
            at = ctypes.c_uint(0x1000)
            _syscall("mount_setattr", 442, ctypes.c_int(tree), empty, at, attr, ctypes.c_size_t(32))
        finally:
            os.close(userns)
    except BaseException:
        os.close(tree)
        raise
    return tree


def _clone(layer):
    """A clone of ``layer`` in this namespace (a detached mount another made: the overlay
    takes no mount of another namespace as a layer)."""
    import ctypes
    empty = ctypes.c_char_p(b"")
    flags = ctypes.c_uint(0x1001 | os.O_CLOEXEC)  # OPEN_TREE_CLONE | AT_EMPTY_PATH
    return _syscall("open_tree", 428, ctypes.c_int(layer), empty, flags)


def _fsconfig(fs, command, key, aux, what):
    import ctypes
    key = ctypes.c_char_p(None if key is None else key.encode())
    _syscall(what, 431, ctypes.c_int(fs), ctypes.c_uint(command), key, ctypes.c_char_p(None),
             ctypes.c_int(aux))


def _merged(layers, userxattr):
    """The detached read-only overlay of ``layers`` (top first): a stack's merged view,
    whose whiteouts and opaque folders are read in the attribute mode the fork's own
    overlay wrote them in (``userxattr``: ``user.*``, else ``trusted.*``)."""
    import ctypes
    clones = []
    fs = -1
    try:
        for layer in layers:
            clones.append(_clone(layer))
        fs = _syscall("fsopen overlay", 430, ctypes.c_char_p(b"overlay"), ctypes.c_uint(1))
        for clone in clones:
            _fsconfig(fs, 5, "lowerdir+", clone, "fsconfig lowerdir+")  # FSCONFIG_SET_FD
        if userxattr:
            _fsconfig(fs, 0, "userxattr", 0, "fsconfig userxattr")  # FSCONFIG_SET_FLAG
        _fsconfig(fs, 6, None, 0, "create the stack's overlay")  # FSCONFIG_CMD_CREATE
        # RDONLY | NOSUID | NODEV | NOEXEC, detached (FSMOUNT_CLOEXEC)
        return _syscall("fsmount the stack's overlay", 432, ctypes.c_int(fs), ctypes.c_uint(1),
                        ctypes.c_uint(0xF))
    finally:
        for fd in clones + ([fs] if fs >= 0 else []):
            os.close(fd)


def _made_mount(op, header, fds):
    """The mount an ``idmap`` (one layer, for a uid) or a ``merge`` (a stack) asks for."""
    if op == "idmap":
        if len(fds) != 1:
            raise OSError(errno.EBADF, "no layer was passed")
        return _idmapped(fds[0], int(header["uid"]), int(header["gid"]))
    if not 2 <= len(fds) <= _MAX_LAYERS:
        raise OSError(errno.EBADF, "no stack of layers was passed")
    return _merged(fds, bool(header.get("userxattr")))


def _answer_with_mount(sock, op, header, fds):
    """Send the mount ``op`` makes of the passed layers, or why not; close what came."""
    try:
        made = _made_mount(op, header, fds)
        try:
            _send_fd(sock, made)
        finally:
            os.close(made)
    except OSError as exc:
        _send(sock, {"errno": exc.errno or errno.EIO, "message": exc.strerror or str(exc)})
    finally:
        for fd in fds:
            os.close(fd)


def _send_fd(sock, fd):
    text = json.dumps({}).encode()
    data = _FRAME.pack(len(text), 0) + text
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
    sent = sock.sendmsg([data], rights)
    sock.sendall(data[sent:])


def _serve(sock):
    held = None
    while True:
        fds = []
        try:
            head = _exact(sock, _FRAME.size, fds)
            size, body_size = _FRAME.unpack(head)
            header = json.loads(_exact(sock, size, fds).decode())
            body = _exact(sock, body_size, fds)
        except EOFError:
            return
        op = header.get("op")
        if op in ("idmap", "merge"):
            _answer_with_mount(sock, op, header, fds)
            continue
        if op == "list" or (op == "read" and fds):
            if held is not None:
                os.close(held)
            held = fds.pop(0) if fds else None
        for fd in fds:
            os.close(fd)
        if held is None:
            _send(sock, {"errno": errno.EBADF, "message": "no layer was passed"})
            continue
        root = "/proc/self/fd/%d" % held
        try:
            if op == "list":
                outbox = header.get("outbox") or ""
                layer = _Layer(root + "/.", root + "/./" + outbox if outbox else "")
                request = {"phase": "list", "max_files": int(header["max_files"])}
                _send(sock, {}, pack(request, b"", layer)[1])
            elif op == "hash":
                digests = []
                for name_hex, size in json.loads(body.decode()):
                    name = bytes.fromhex(name_hex)
                    try:
                        digests.append(_digest(held, name, int(size)))
                    except OSError as exc:
                        message = exc.strerror or str(exc)
                        code = exc.errno or errno.EIO
                        _send(sock, {"errno": code, "message": message, "name": name_hex})
                        break
                else:
                    _send(sock, {"digests": digests})
            elif op == "read":
                for name_hex, size in json.loads(body.decode()):
                    try:
                        _stream(sock, held, bytes.fromhex(name_hex), int(size))
                    except OSError as exc:
                        message = exc.strerror or str(exc)
                        code = exc.errno or errno.EIO
                        _send(sock, {"errno": code, "message": message, "name": name_hex})
                        break
            elif op == "done":
                os.close(held)
                held = None
                _send(sock, {})
            else:
                _send(sock, {"errno": errno.EINVAL, "message": "unknown op"})
        except Refused as exc:
            _send(sock, {"errno": exc.code, "message": str(exc)})
        except OSError as exc:
            _send(sock, {"errno": exc.errno or errno.EIO, "message": str(exc)})


_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_sock.connect(sys.argv[1])
_serve(_sock)
'''


def reader_spec(
    folder: str,
    *,
    image: str,
    python: str,
    seccomp_profile: str | Mapping[str, object],
    labels: dict[str, str],
) -> ContainerSpec:
    """The reader's container: ``folder`` (the host's socket) bound in, nothing else."""
    profile = seccomp_profile if isinstance(seccomp_profile, str) else profile_text(seccomp_profile)
    return ContainerSpec(
        image=image,
        command=(python, "-I", "-S", "-c", reader_code(), f"{READER_DIR}/{CHANNEL_SOCKET}"),
        user="0:0",
        environment={},
        working_dir="/",
        labels=labels,
        host_config={
            "network_mode": "none",
            "read_only": True,
            "cap_drop": ["ALL"],
            # Read and search any file and folder of the layer (the turn's uid's), and,
            # for a fork's idmapped clone of the layer, map ids and mount (``_userns``).
            "cap_add": ["DAC_READ_SEARCH", "SYS_ADMIN", "SETUID", "SETGID"],
            "security_opt": ["no-new-privileges", f"seccomp={profile}"],
            "ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}],
            "pids_limit": 8,
            "mem_limit": _MEMORY,
            "memswap_limit": _MEMORY,
            "binds": [f"{folder}:{READER_DIR}:ro"],
            "ipc_mode": "none",
            "log_config": {"Type": "none", "Config": {}},
        },
        host_config_extra={},
        open_stdin=False,
    )


def reader_code() -> str:
    """The reader's program: the file worker's listing and the loop above (stdlib-only)."""
    source = inspect.getsource(_snapfiles).replace("from __future__ import annotations\n", "")
    bound = f"\n_MAX_LAYERS = {MAX_LAYERS}  # the most layers a stack's merged view takes\n"
    return "from __future__ import annotations\n" + source + bound + _MAIN


class ReaderFailedError(ConnectionError):
    """The reader could not be started or reached, or broke off: the host copies instead."""


class LayerRefusedError(OSError):
    """What the reader met in the layer (its errno): the snapshot is refused, as the host's
    own read refuses it. Never a ``ConnectionError``, whatever the errno."""


class _Session:
    """One layer's reads, while ``LayerReader``'s lock is held."""

    def __init__(self, reader: LayerReader, fd: int) -> None:
        self._reader = reader
        self._fd = fd

    def listing(self, outbox: str, max_files: int) -> bytes:
        """The layer's listing, as the file worker's ``snapshot`` reply's body holds it.

        Raises ``OSError`` with the listing's refusal (``EFBIG``: more than ``max_files``)."""
        request = {"op": "list", "outbox": outbox, "max_files": max_files}
        _, body = self._reader._ask(request, fds=(self._fd,))
        return body

    def digests(self, files: list[tuple[bytes, int]]) -> list[str]:
        """The sha256 of each of ``files`` (name, size), read from the layer."""
        body = json.dumps([[name.hex(), size] for name, size in files]).encode()
        header, _ = self._reader._ask({"op": "hash"}, body)
        digests = header.get("digests")
        if not isinstance(digests, list) or len(digests) != len(files):
            raise ReaderFailedError(errno.EPROTO, "the layer reader's digests do not match")
        if not all(isinstance(d, str) and len(d) == 64 for d in digests):
            raise ReaderFailedError(errno.EPROTO, "the layer reader sent a malformed digest")
        return digests

    def contents(self, files: list[tuple[bytes, int]]) -> Iterator[Iterator[bytes]]:
        """The bytes of each of ``files`` (name, size), in order, each as pieces streamed
        from the layer (at most ``_snapfiles._CHUNK`` bytes each): one file's pieces are
        taken before the next file's. The reader sends what the file holds, up to one
        byte past ``size``; what it sends is the caller's to count and hash against the
        manifest. Raises ``LayerRefusedError`` (its refusal, naming the file) or
        ``ReaderFailedError``. The reader is closed where the stream is left unfinished
        (its further pieces would be taken for the next request's reply)."""
        body = json.dumps([[name.hex(), size] for name, size in files]).encode()
        reader = self._reader
        finished = False
        try:
            reader._request({"op": "read"}, body, fds=(self._fd,))
            frames = _Frames(reader)
            for _ in files:
                yield _pieces(frames)
            finished = True
        finally:
            if not finished:
                reader.close()


class _Frames:
    """A streamed reply's frames, received in blocks of up to 1 MiB, not a receive per
    header and body: a small file's bytes are one frame, which would cost more in calls
    than in bytes. Only for a stream, which passes no descriptor."""

    def __init__(self, reader: LayerReader) -> None:
        self._reader = reader
        self._sock: socket.socket = reader._state[1]
        self._data = b""
        self._at = 0

    def next(self) -> tuple[dict[str, Any], bytes]:
        """The next frame (its body one piece at most); the reader's refusal raised."""
        try:
            size, body_size = _sizes(self._take(_FRAME.size), _snapfiles._CHUNK)
            answer = json.loads(self._take(size))
            body = self._take(body_size)
        except (OSError, ValueError) as exc:
            self._reader.close()
            raise ReaderFailedError(errno.EIO, f"the layer reader broke off: {exc}") from exc
        if not isinstance(answer, dict):
            self._reader.close()
            raise ReaderFailedError(errno.EPROTO, "the layer reader's reply is malformed")
        refusal = _refusal(answer)
        if refusal is not None:
            raise refusal
        return answer, body

    def _take(self, size: int) -> bytes:
        held = len(self._data) - self._at
        if held >= size:
            self._at += size
            return self._data[self._at - size : self._at]
        if size - held > 1 << 16:  # a large piece: the rest straight from the socket
            taken = self._data[self._at :] + _exact(self._sock, size - held)
            self._data, self._at = b"", 0
            return taken
        while len(self._data) - self._at < size:
            more = self._sock.recv(1 << 20)
            if not more:
                raise OSError(errno.ECONNRESET, "the layer reader ended")
            self._data, self._at = self._data[self._at :] + more, 0
        self._at += size
        return self._data[self._at - size : self._at]


def _refusal(answer: dict[str, Any]) -> LayerRefusedError | None:
    """The reader's refusal its reply says (its errno, naming the file), or None."""
    code = answer.get("errno")
    if code is None:
        return None
    name = answer.get("name")
    what = f"{bytes.fromhex(name)!r}: " if isinstance(name, str) else ""
    return LayerRefusedError(int(code), f"{what}{answer.get('message', '')}")


def _pieces(frames: _Frames) -> Iterator[bytes]:
    """One streamed file's pieces, to the reader's end mark (on its last piece, or alone)."""
    while True:
        header, piece = frames.next()
        end = header.get("end") is True
        if not piece and not end:
            raise ReaderFailedError(errno.EPROTO, "the layer reader sent an empty piece")
        if piece:
            yield piece
        if end:
            return


class LayerReader:
    """The host's end of its reader container (``start`` makes it, at the first read)."""

    def __init__(self, start: Callable[[ContainerSpec, Callable[..., socket.socket]], Any]) -> None:
        #: ``start(spec, meet)``: the engine's ``start_meeting``, returning the attach
        #: channel and what ``meet(attach, starting)`` returned (the reader's socket).
        self._start = start
        self._lock = threading.Lock()
        self._state: list[Any] = []  # [attach, sock] while it runs
        #: Whether the reader can make a fork's idmapped clone (``idmapped``), known from
        #: the first layer it reads: where it cannot (a kernel or a security module that
        #: refuses it), it reads no layer, and the forks copy rather than fail to start.
        self._idmaps: bool | None = None
        self._finalizer = weakref.finalize(self, _stop, self._state)

    @contextlib.contextmanager
    def layer(self, fd: int, spec: Callable[[str], ContainerSpec]) -> Iterator[_Session]:
        """Reads of the layer whose detached mount ``fd`` is (a copy goes to the reader,
        closed at the end). ``spec(folder)``: the reader's container, its socket folder
        ``folder``. Raises ``ReaderFailedError`` where the reader cannot serve."""
        with self._lock:
            if not self._state:
                self._launch(spec)
            if self._idmaps is None:
                self._idmaps = self._can_idmap(fd)
            if not self._idmaps:
                raise ReaderFailedError(errno.EOPNOTSUPP, "the reader cannot idmap a layer")
            try:
                yield _Session(self, fd)
            finally:
                with contextlib.suppress(OSError):
                    if self._state:
                        self._ask({"op": "done"})

    def idmapped(self, fd: int, uid: int, gid: int, spec: Callable[[str], ContainerSpec]) -> int:
        """A detached, read-only clone of the layer ``fd`` whose owner's files show as
        ``uid``/``gid`` (an idmapped mount): the layer a fork of that leased uid's server
        clones and lays its overlay on, so its calls own the files, as its parent's did.
        The caller's to close. Raises ``ReaderFailedError`` or the reader's refusal."""
        with self._lock:
            if not self._state:
                self._launch(spec)
            header, _ = self._ask({"op": "idmap", "uid": uid, "gid": gid}, fds=(fd,))
        passed = header.get("_fds") or []
        if len(passed) != 1:
            for extra in passed:
                os.close(extra)
            raise ReaderFailedError(errno.EPROTO, "the layer reader passed no layer")
        mapped: int = passed[0]
        info = os.fstat(mapped)
        if (
            not os.fstatvfs(mapped).f_flag & os.ST_RDONLY
            or not stat.S_ISDIR(info.st_mode)
            or (info.st_uid, info.st_gid) != (uid, gid)
        ):
            os.close(mapped)
            raise ReaderFailedError(errno.EPROTO, "the reader's clone is not the fork's layer")
        return mapped

    def merged(
        self, layers: tuple[int, ...], userxattr: bool, spec: Callable[[str], ContainerSpec]
    ) -> int:
        """The merged view of a stack of frozen layers (``layers``, top first): their
        detached read-only overlay (lower layers only; ``nosuid``, ``nodev``, ``noexec``),
        made by the reader, which alone may read the layers' files and, where the forks'
        overlays wrote them so, their ``trusted.*`` whiteouts (``userxattr`` False). The
        caller's to close; read as a held layer is (``layer``). Raises
        ``ReaderFailedError`` or the reader's refusal."""
        with self._lock:
            if not self._state:
                self._launch(spec)
            header, _ = self._ask({"op": "merge", "userxattr": userxattr}, fds=layers)
        passed = header.get("_fds") or []
        if len(passed) != 1:
            for extra in passed:
                os.close(extra)
            raise ReaderFailedError(errno.EPROTO, "the layer reader passed no merged view")
        view: int = passed[0]
        if not os.fstatvfs(view).f_flag & os.ST_RDONLY or not stat.S_ISDIR(os.fstat(view).st_mode):
            os.close(view)
            raise ReaderFailedError(errno.EPROTO, "the reader's merged view is not read-only")
        return view

    def _can_idmap(self, fd: int) -> bool:
        """Whether the reader can make an idmapped clone of the layer ``fd`` (tried once,
        to the layer's own owner, and closed)."""
        info = os.fstat(fd)
        try:
            header, _ = self._ask(
                {"op": "idmap", "uid": info.st_uid, "gid": info.st_gid}, fds=(fd,)
            )
        except LayerRefusedError:
            return False
        for passed in header.get("_fds") or []:
            os.close(passed)
        return True

    def _launch(self, spec: Callable[[str], ContainerSpec]) -> None:
        listener = Listener(0)  # the reader is its container's root: uid 0 on the host
        try:

            def meet(attach: AttachChannel, starting: Starting) -> socket.socket:
                return listener.accept(attach, _TIMEOUT, starting)

            try:
                attach, sock = self._start(spec(listener.folder), meet)
            except Exception as exc:
                raise ReaderFailedError(
                    errno.EIO, f"the layer reader did not start: {exc}"
                ) from exc
        finally:
            listener.close()
        sock.settimeout(_TIMEOUT)
        self._state[:] = [attach, sock]

    def _ask(
        self,
        header: dict[str, Any],
        body: bytes = b"",
        *,
        fds: tuple[int, ...] = (),
    ) -> tuple[dict[str, Any], bytes]:
        self._request(header, body, fds=fds)
        return self._reply()

    def _request(
        self, header: dict[str, Any], body: bytes = b"", *, fds: tuple[int, ...] = ()
    ) -> None:
        sock: socket.socket = self._state[1]
        text = json.dumps(header).encode()
        data = _FRAME.pack(len(text), len(body)) + text + body
        try:
            if fds:
                ancillary = [
                    (socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))
                ]
                sent = sock.sendmsg([data], ancillary)
                sock.sendall(data[sent:])
            else:
                sock.sendall(data)
        except OSError as exc:
            self.close()
            raise ReaderFailedError(errno.EIO, f"the layer reader broke off: {exc}") from exc

    def _reply(self) -> tuple[dict[str, Any], bytes]:
        """The reader's reply, with the descriptors it passed (``_fds``); its refusal
        raised (``LayerRefusedError``)."""
        sock: socket.socket = self._state[1]
        fds_in: list[int] = []
        try:
            size, body_size = _sizes(_first(sock, _FRAME.size, fds_in), _MAX_REPLY)
            answer = json.loads(_exact(sock, size))
            answered = _exact(sock, body_size)
        except (OSError, ValueError) as exc:
            for fd in fds_in:
                os.close(fd)
            self.close()
            raise ReaderFailedError(errno.EIO, f"the layer reader broke off: {exc}") from exc
        if not isinstance(answer, dict):
            for fd in fds_in:
                os.close(fd)
            self.close()
            raise ReaderFailedError(errno.EPROTO, "the layer reader's reply is malformed")
        answer["_fds"] = fds_in
        refusal = _refusal(answer)
        if refusal is not None:
            for fd in fds_in:
                os.close(fd)
            raise refusal
        return answer, answered

    def close(self) -> None:
        """Remove the reader's container (it is started again at the next read). Never raises."""
        _stop(self._state)


def _sizes(head: bytes, max_body: int) -> tuple[int, int]:
    size, body_size = _FRAME.unpack(head)
    if size > _MAX_REPLY or body_size > max_body:
        raise OSError(errno.EPROTO, "the layer reader's reply is too large")
    return size, body_size


def _first(sock: socket.socket, size: int, fds: list[int]) -> bytes:
    """``_exact``, taking the descriptors passed with the first bytes (``SCM_RIGHTS``)."""
    data, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(16), socket.MSG_CMSG_CLOEXEC)
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(raw) - len(raw) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", raw[:usable]))
    if not data:
        raise OSError(errno.ECONNRESET, "the layer reader ended")
    return data + _exact(sock, size - len(data))


def _exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise OSError(errno.ECONNRESET, "the layer reader ended")
        data += chunk
    return bytes(data)


def _stop(state: list[Any]) -> None:
    if not state:
        return
    attach, sock = state
    state.clear()
    with contextlib.suppress(OSError):
        sock.close()
    with contextlib.suppress(Exception):
        attach.close()
