"""The eval relaxations, attacked: a writable per-turn root, and a root identity without privilege.

``Policy(writable_root=True)`` and ``Policy(root_identity=True)`` are opt-in
choices for eval harnesses. Each test here opens turns with one or both and
checks that what they give works (a package installs into the system
site-packages) and that every other promise still holds (no mount, no module,
no network, no host file changed, nothing left running, no set-id file, the
disk limit, one turn's layers unseen by another).
"""

from __future__ import annotations

import base64
import compileall
import ensurepip
import errno
import hashlib
import os
import shutil
import stat
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from astralvessel.errors import BackendUnavailableError
from astralvessel.sandbox import DEFAULT_UID_RANGE, Mount, Policy, Sandbox, SandboxSession
from astralvessel.sandbox._discovery import get_backend

from .calls import py, py_json, run, wait_until_gone
from .conftest import TEST_LIMITS

#: A writable root copies every directory of /usr into the workspace (15 000 on Debian), and
#: the workspace holds one inode per 2 KiB of its disk limit: 64 MB leaves room for both.
LIMITS = attrs.evolve(TEST_LIMITS, disk_mb=64)

#: Every backend that runs the sandbox server; ``docker-exec`` refuses both (tested below).
SERVER_BACKENDS = ["bubblewrap", "nsjail", "docker"]
OpenTurn = Callable[..., SandboxSession]


@pytest.fixture(params=SERVER_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Sandbox:
    """A backend with a sandbox server, found by name."""
    return get_backend(request.param)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel ``avtiny`` built here: no index, no network."""
    files = {
        "avtiny/__init__.py": b"ANSWER = 42\n",
        "avtiny-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: avtiny\nVersion: 0.1\n",
        "avtiny-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: astralvessel-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = [_record_line(name, data) for name, data in files.items()]
    record.append("avtiny-0.1.dist-info/RECORD,,")
    files["avtiny-0.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / "avtiny-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def _unpacked_pip(folder: Path) -> None:
    """Put pip (the host interpreter's bundled wheel, or the pip this test runs beside) in
    ``folder/pip`` with its modules compiled: run from its zipped wheel, every call compiled
    pip's hundreds of modules afresh, 10 s of each test on a loaded host.
    """
    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if bundled:
        with zipfile.ZipFile(bundled[-1]) as archive:
            archive.extractall(folder, [n for n in archive.namelist() if n.startswith("pip/")])
    else:
        # Debian's interpreter strips ensurepip's wheels. Its pip comes compiled: copies
        # keep their times, so compile_dir below finds the compiled modules current.
        import pip

        shutil.copytree(Path(pip.__file__).parent, folder / "pip")
    # Compiled by this interpreter: a sandbox's python3 of another version compiles as before.
    compileall.compile_dir(folder / "pip", quiet=1, workers=0)


def _world_readable(folder: Path) -> None:
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every turn here mounts read-only at /packages, with a tiny wheel; made once."""
    folder = tmp_path_factory.mktemp("packages")
    _tiny_wheel(folder)
    _world_readable(folder)
    return folder


@pytest.fixture(scope="module")
def pip(packages: Path) -> Path:
    """``packages`` with pip in it too, unpacked and compiled; made once, and only for the
    tests that run pip (7 s at load 10, in sessions that leave those tests out)."""
    _unpacked_pip(packages)
    _world_readable(packages)
    return packages


@pytest.fixture
def writable(tmp_path: Path) -> Path:
    """A host folder mounted writable at /out."""
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    return out


@pytest.fixture
def open_turn(backend: Sandbox, packages: Path, writable: Path) -> Iterator[OpenTurn]:
    """Open turns of ``backend`` with the relaxations asked for; all are closed after the test."""
    opened: list[SandboxSession] = []

    def start(*, writable_root: bool = False, root_identity: bool = False) -> SandboxSession:
        policy = Policy(
            workdir="/out",
            mounts=(
                Mount.from_pair("/packages", packages),
                Mount.from_pair("/out", writable, writable=True),
            ),
            limits=LIMITS,
            writable_root=writable_root,
            root_identity=root_identity,
        )
        turn = backend.start(policy)
        opened.append(turn)
        return turn

    yield start
    for turn in opened:
        turn.close()


def _pip(turn: SandboxSession) -> str:
    outcome = run(
        turn,
        "python3",
        "/packages/pip",
        "install",
        "--no-index",
        "--no-cache-dir",
        "--break-system-packages",
        "--disable-pip-version-check",
        "/packages/avtiny-0.1-py3-none-any.whl",
        timeout=120,
    )
    assert outcome.exit_code == 0, outcome.output
    return outcome.output


# -- a writable root -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("root_identity", [False, True], ids=["nobody", "root"])
def test_pip_installs_into_the_system_site_packages(open_turn, pip, root_identity):
    """pip installs a local wheel into the system site-packages, and the next call imports it."""
    turn = open_turn(writable_root=True, root_identity=root_identity)
    _pip(turn)
    found = py_json(
        turn, "import avtiny, json; print(json.dumps([avtiny.__file__, avtiny.ANSWER]))"
    )
    assert found[0].startswith("/usr/local/lib/python3"), found
    assert found[1] == 42


def test_writes_anywhere_in_the_root(open_turn):
    """/usr, /etc, /opt, /srv and a sticky, world-writable /var/tmp take files for the turn."""
    turn = open_turn(writable_root=True)
    outcome = run(
        turn,
        "sh",
        "-c",
        "set -e; echo a > /usr/local/bin/av-new; echo b > /opt/av-new; "
        "echo c > /var/tmp/av-new; echo d > /srv/av-new; stat -c %a /var/tmp; "
        "echo 'nameserver 192.0.2.1' > /etc/av-resolv; sed -i 's/^/#/' /etc/hostname; "
        "cat /usr/local/bin/av-new /opt/av-new /var/tmp/av-new /srv/av-new /etc/av-resolv",
    )
    assert outcome.exit_code == 0, outcome.output
    assert outcome.output.split() == ["1777", "a", "b", "c", "d", "nameserver", "192.0.2.1"]


def test_the_hosts_usr_and_etc_are_unchanged(open_turn, backend):
    """Files written, replaced and removed under /usr and /etc never reach the host's."""
    turn = open_turn(writable_root=True)
    marker = f"av-{os.getpid()}-{os.urandom(3).hex()}"
    outcome = run(
        turn,
        "sh",
        "-c",
        f"set -e; echo x > /usr/bin/{marker}; echo x > /etc/{marker}; "
        "rm /usr/lib/os-release; echo y > /usr/lib/os-release",
    )
    assert outcome.exit_code == 0, outcome.output
    if backend.name != "docker":
        assert not Path(f"/usr/bin/{marker}").exists()
        assert not Path(f"/etc/{marker}").exists()
        assert Path("/usr/lib/os-release").read_text().strip() != "y"
    # A later turn (on Docker: a fresh container of the same image) starts from the original.
    fresh = open_turn(writable_root=True)
    seen = run(
        fresh,
        "sh",
        "-c",
        f"[ -e /usr/bin/{marker} ] || [ -e /etc/{marker} ] && echo leaked; "
        "grep -c '^ID=' /usr/lib/os-release",
    )
    assert seen.output.split() == ["1"], seen.output


def test_one_turns_layers_are_unseen_by_another(open_turn):
    """What one turn writes to its root, another turn open at the same time does not see."""
    first = open_turn(writable_root=True)
    second = open_turn(writable_root=True)
    assert run(first, "sh", "-c", "echo mine > /opt/only-first").exit_code == 0
    assert run(second, "ls", "/opt/only-first").exit_code != 0
    assert run(second, "sh", "-c", "echo other > /usr/local/only-second").exit_code == 0
    assert run(first, "ls", "/usr/local/only-second").exit_code != 0


def test_root_writes_count_against_the_disk_limit(open_turn):
    """Writes to /usr, /opt and the workspace share one disk limit: together they cannot pass it."""
    turn = open_turn(writable_root=True)
    limit = LIMITS.disk_mb * 1024 * 1024
    written = py_json(
        turn,
        f"""
        import json, os
        total = 0
        block = b"x" * 65536
        for path in ("/usr/local/big", "/opt/big", "/workspace/big", "/var/big"):
            try:
                with open(path, "wb") as handle:
                    while total < {limit} * 2:
                        handle.write(block)
                        handle.flush()
                        total += len(block)
            except OSError as exc:
                assert exc.errno in (28, 27), exc
        print(json.dumps(total))
        """,
    )
    assert written <= limit


def test_layers_are_hidden_from_calls(open_turn):
    """The folder holding the layers is an empty read-only place: calls cannot reach behind them."""
    turn = open_turn(writable_root=True)
    seen = py_json(
        turn,
        """
        import json, os
        path = "/workspace/.vessel-root"
        try:
            open(path + "/upper-probe", "w")
            made = True
        except OSError:
            made = False
        print(json.dumps([os.listdir(path), made]))
        """,
    )
    assert seen == [[], False]


def test_no_setid_file_in_the_writable_root(open_turn):
    """A call cannot leave a set-id file in /usr, and the overlay grants none anyway (nosuid)."""
    turn = open_turn(writable_root=True, root_identity=True)
    result = py_json(
        turn,
        """
        import json, os, shutil
        shutil.copy("/usr/bin/true", "/usr/local/bin/av-suid")
        try:
            os.chmod("/usr/local/bin/av-suid", 0o4755)
            chmod = "done"
        except OSError as exc:
            chmod = exc.errno
        mode = os.stat("/usr/local/bin/av-suid").st_mode
        print(json.dumps([chmod, bool(mode & 0o6000), bool(os.statvfs("/usr").f_flag & 2)]))
        """,
    )
    assert result[0] != "done"
    assert result[1:] == [False, True]


# -- a root identity ------------------------------------------------------------------


def test_root_identity_is_uid_zero_holding_nothing(open_turn):
    """Calls are uid and gid 0, with every capability set empty, no_new_privs and locked bits."""
    turn = open_turn(root_identity=True)
    status = py_json(
        turn,
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        fields = dict(
            line.split(":", 1) for line in open("/proc/self/status").read().splitlines()
        )
        caps = {k: fields[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
        print(json.dumps([os.getuid(), os.getgid(), os.geteuid(), caps,
                          fields["NoNewPrivs"].strip(), libc.prctl(27, 0, 0, 0, 0)]))
        """,
    )
    uid, gid, euid, caps, nnp, securebits = status
    assert (uid, gid, euid) == (0, 0, 0)
    assert set(caps.values()) == {"0000000000000000"}
    assert nnp == "1"
    assert securebits & 0x03 == 0x03  # SECBIT_NOROOT and its lock


def test_root_identity_cannot_mount_unshare_or_load_modules(open_turn):
    """Root in the sandbox gets EPERM (or ENOSYS) from mount, unshare, chroot and module loading."""
    turn = open_turn(writable_root=True, root_identity=True)
    result = py_json(
        turn,
        """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(result):
            return 0 if result == 0 else ctypes.get_errno()
        out = {
            "mount": errno_of(libc.mount(b"none", b"/opt", b"tmpfs", 0, None)),
            "bind": errno_of(libc.mount(b"/usr", b"/opt", None, 4096, None)),
            "unshare": errno_of(libc.unshare(0x10000000)),
            "unshare_ns": errno_of(libc.unshare(0x00020000)),
            "chroot": errno_of(libc.chroot(b"/opt")),
            "init_module": errno_of(libc.syscall(175, None, 0, b"")),
            "finit_module": errno_of(libc.syscall(313, 0, b"", 0)),
            "sethostname": errno_of(libc.sethostname(b"x", 1)),
            "setuid": errno_of(libc.setuid(1000)),
        }
        print(json.dumps(out))
        """,
    )
    # setuid to an id the namespace does not map is EINVAL: no other identity exists in it.
    refused = {errno.EPERM, errno.ENOSYS, errno.EACCES, errno.EINVAL}
    assert {name: code for name, code in result.items() if code not in refused} == {}


def test_root_identity_cannot_change_the_hosts_files(open_turn, packages):
    """Read-only mounts and the host's system files stay unwritable to root in the sandbox; a
    chown there succeeds (root identity's no-op) and changes no owner."""
    turn = open_turn(root_identity=True)
    wheel = packages / "avtiny-0.1-py3-none-any.whl"
    owner = wheel.stat()
    outcome = run(
        turn,
        "sh",
        "-c",
        "echo x > /packages/av-x; echo x > /usr/bin/av-x; echo x >> /etc/hostname; "
        "chmod 777 /usr/bin; chown 0 /packages/avtiny-0.1-py3-none-any.whl && echo chowned; "
        "echo done",
    )
    refusals = ("Read-only file system", "Permission denied", "Operation not permitted")
    lines = outcome.output.splitlines()
    assert lines[-2:] == ["chowned", "done"]
    assert len([line for line in lines[:-2] if line.endswith(refusals)]) == 4, outcome.output
    assert not (packages / "av-x").exists()
    assert not Path("/usr/bin/av-x").exists()
    after = wheel.stat()
    assert (after.st_uid, after.st_gid) == (owner.st_uid, owner.st_gid)


def test_root_identity_files_land_as_the_unprivileged_user(open_turn, writable):
    """A file root writes through a writable mount belongs to the sandbox's own user on the host."""
    turn = open_turn(root_identity=True)
    outcome = run(turn, "sh", "-c", "echo x > /out/from-root && ls -ln /out/from-root")
    assert outcome.exit_code == 0, outcome.output
    owner = (writable / "from-root").stat()
    assert owner.st_uid != 0
    if os.geteuid() == 0:
        # As root, the turn's own leased host uid (see test_turn_identity).
        assert DEFAULT_UID_RANGE.first <= owner.st_uid <= DEFAULT_UID_RANGE.last
    else:
        assert owner.st_uid == os.geteuid()


def test_root_identity_has_no_network(open_turn):
    """Root in the sandbox reaches no address outside, and cannot bring up an interface."""
    turn = open_turn(root_identity=True)
    result = py_json(
        turn,
        """
        import json, socket, subprocess
        try:
            socket.create_connection(("192.0.2.1", 80), timeout=2)
            out = "connected"
        except OSError as exc:
            out = exc.errno
        names = sorted(n for _, n in socket.if_nameindex())
        print(json.dumps([out, names]))
        """,
    )
    assert result[0] != "connected"
    assert result[1] == ["lo"]


def test_root_identity_sees_only_the_filesystem_view(open_turn):
    """Root sees the same root as any call, and cannot read a process's root or the host's /proc."""
    turn = open_turn(root_identity=True)
    result = py_json(
        turn,
        """
        import json, os
        def attempt(action):
            try:
                action()
                return "done"
            except OSError as exc:
                return exc.errno
        print(json.dumps([
            sorted(os.listdir("/")),
            attempt(lambda: os.listdir("/proc/1/root")),
            attempt(lambda: open("/proc/1/environ").read()),
            sorted(p for p in os.listdir("/proc") if p.isdigit()) != [],
        ]))
        """,
    )
    roots, proc_root, environ, _ = result
    assert not {"home", "var", "opt"} & set(roots), roots
    assert proc_root != "done"
    assert environ != "done"


def test_root_identity_processes_end_with_the_call(open_turn):
    """A daemon root starts in a call is gone when the call returns."""
    turn = open_turn(writable_root=True, root_identity=True)
    marker_seconds = str(10_000 + int.from_bytes(os.urandom(2), "big"))
    outcome = py(
        turn,
        f"""
        import subprocess
        subprocess.Popen(["sleep", "{marker_seconds}"], start_new_session=False)
        print("started")
        """,
    )
    assert "started" in outcome.output
    assert wait_until_gone(f"sleep {marker_seconds}") == []


def test_root_identity_cannot_make_setid_files(open_turn, writable):
    """Root in the sandbox cannot give a file a set-id mode, and none lands on the host."""
    turn = open_turn(root_identity=True)
    result = py_json(
        turn,
        """
        import json, os, shutil
        shutil.copy("/usr/bin/true", "/out/suid")
        try:
            os.chmod("/out/suid", 0o6755)
            out = "done"
        except OSError as exc:
            out = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result != "done"
    assert not (writable / "suid").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


def test_docker_exec_refuses_both():
    """docker-exec, which runs no server, refuses each relaxation instead of ignoring it."""
    backend = get_backend("docker-exec")
    for asked in ({"writable_root": True}, {"root_identity": True}):
        with pytest.raises(BackendUnavailableError, match=next(iter(asked))):
            backend.start(Policy(limits=TEST_LIMITS, **asked)).close()


def test_writable_etc_shows_no_more_than_before(open_turn):
    """The turn's copy of /etc holds what calls could read before and nothing more but its own
    seeds: never the image's or host's shadow, only one with every password locked."""
    before = open_turn()
    after = open_turn(writable_root=True, root_identity=True)
    listing = "find /etc -readable -type f"
    readable_before = run(before, "sh", "-c", listing).output.split()
    readable_after = run(after, "sh", "-c", listing).output.split()
    seeds = {"/etc/shadow", "/etc/pam.d/other"}
    assert set(readable_after) - set(readable_before) <= seeds
    shadow = run(after, "cat", "/etc/shadow")
    assert shadow.exit_code == 0
    entries = [line.split(":") for line in shadow.output.splitlines()]
    assert entries
    assert all(fields[1] == "*" for fields in entries), shadow.output
