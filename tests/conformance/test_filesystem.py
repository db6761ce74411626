"""Promise: a call sees only system dirs, /agent, the workdir, mounts and the workspace; writes only the workspace."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel.sandbox import Mount, Policy, Sandbox

from .calls import py_json


@pytest.fixture
def canaries() -> Iterator[dict[str, str]]:
    """Secret files the host left in its home, /tmp and /var/tmp (world-readable, so only the view hides them)."""
    secret = f"canary-{uuid.uuid4().hex}"
    paths = [Path.home() / f".{secret}", Path("/tmp") / secret, Path("/var/tmp") / secret]
    for path in paths:
        path.write_text(secret)
        path.chmod(0o644)
    try:
        yield {str(path): secret for path in paths}
    finally:
        for path in paths:
            path.unlink(missing_ok=True)


def test_host_canaries_invisible(session, canaries):
    """Files the host left in its home, /tmp and /var/tmp cannot be read or even found."""
    result = py_json(
        session,
        f"""
        import json
        out = {{}}
        for path in {list(canaries)!r}:
            try:
                out[path] = open(path).read()
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert set(canaries.values()).isdisjoint(str(v) for v in result.values())
    assert all(value in (errno.ENOENT, errno.EACCES) for value in result.values())


def test_root_shows_only_the_documented_tree(session):
    """The sandbox root holds only system dirs, /agent, the workdir, the workspace, /proc, /dev and the interpreter's parent."""
    names = set(py_json(session, "import json, os; print(json.dumps(os.listdir('/')))"))
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "agent", "data"}
    allowed |= {"workspace", "proc", "dev"}
    # The server's interpreter is mounted read-only at its host path (under /root or /opt here).
    extra = names - allowed
    assert len(extra) <= 1, extra
    for name in ("tmp", "home", "var", "srv", "mnt", "sys", "boot"):
        assert name not in names or name in extra


def test_shadow_file_unreadable(session):
    """A root-only host file under a bound system dir (/etc/shadow) cannot be read by a call."""
    result = py_json(
        session,
        """
        import json
        try:
            open("/etc/shadow").read()
            print(json.dumps("read"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result in (errno.EACCES, errno.ENOENT)


@pytest.mark.parametrize(
    "target",
    [
        "/usr/vessel-x",
        "/etc/vessel-x",
        "/agent/vessel-x",
        "/data/vessel-x",
        "/vessel-x",
        "/proc/vessel-x",
        "/dev/vessel-x",
    ],
)
def test_cannot_write_outside_workspace(session, target, data_dir, agent_dir):
    """Creating a file anywhere outside the workspace fails, and nothing appears on the host."""
    result = py_json(
        session,
        f"""
        import json, os
        try:
            os.close(os.open({target!r}, os.O_CREAT | os.O_WRONLY, 0o644))
            print(json.dumps("created"))
        except OSError as exc:
            print(json.dumps(exc.errno))
        """,
    )
    assert result in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT)
    name = "vessel-x"
    assert not (data_dir / name).exists()
    assert not (agent_dir / name).exists()
    assert not Path("/usr", name).exists()
    assert not Path("/etc", name).exists()


def test_cannot_modify_mounted_data(session, data_dir):
    """The read-only data mount cannot be changed: no write, rename, delete or chmod."""
    result = py_json(
        session,
        """
        import json, os
        out = {}
        steps = {
            "append": lambda: open("/data/species.txt", "a").write("wolf"),
            "rename": lambda: os.rename("/data/species.txt", "/data/moved.txt"),
            "unlink": lambda: os.unlink("/data/species.txt"),
            "chmod": lambda: os.chmod("/data/species.txt", 0o777),
        }
        for name, step in steps.items():
            try:
                step()
                out[name] = "done"
            except OSError as exc:
                out[name] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert "done" not in result.values()
    assert (data_dir / "species.txt").read_text() == "otter\nheron\n"


def test_writable_mount_is_writable(backend: Sandbox, policy: Policy, tmp_path):
    """A folder the host mounts writable can be written by a call, and the host sees the file."""
    shared = tmp_path / "shared"
    shared.mkdir()
    # The call runs as an unprivileged user; the host grants it this folder on purpose.
    shared.chmod(0o777)
    rw_policy = Policy(
        agent_dir=policy.agent_dir,
        workdir=policy.workdir,
        mounts=(*policy.mounts, Mount.from_pair("/shared", shared, writable=True)),
        limits=policy.limits,
    )
    turn = backend.start(rw_policy)
    try:
        result = py_json(
            turn,
            "import json; open('/shared/out.txt', 'w').write('from the call'); print(json.dumps('ok'))",
        )
    finally:
        turn.close()
    assert result == "ok"
    assert (shared / "out.txt").read_text() == "from the call"


def test_no_host_sys_or_kernel_knobs(session):
    """/sys is absent and /proc/sys is read-only: a call changes no kernel setting."""
    result = py_json(
        session,
        """
        import json, os
        out = {"sys": os.path.exists("/sys/class")}
        try:
            open("/proc/sys/kernel/hostname", "w").write("x")
            out["proc_sys"] = "written"
        except OSError as exc:
            out["proc_sys"] = exc.errno
        print(json.dumps(out))
        """,
    )
    assert result["sys"] is False
    assert result["proc_sys"] != "written"


def test_host_untouched_by_workspace_writes(session):
    """Files a call writes to its workspace stay in the sandbox: nothing appears in the host's /workspace."""
    py_json(
        session, "import json; open('/workspace/inside.txt', 'w').write('x'); print(json.dumps(1))"
    )
    assert not os.path.exists("/workspace/inside.txt")


def test_a_program_in_the_workspace_runs(session):
    """A script and a copied binary in the workspace run by path: the workspace is not noexec."""
    script = "#!/bin/sh\necho script ran\n"
    result = py_json(
        session,
        f"""
        import json, os, shutil, stat, subprocess
        with open("/workspace/prog.sh", "w") as handle:
            handle.write({script!r})
        shutil.copy("/bin/true", "/workspace/true")
        for name in ("prog.sh", "true"):
            os.chmod("/workspace/" + name, 0o755)
        out = [subprocess.run(["/workspace/" + name], capture_output=True, text=True)
               for name in ("prog.sh", "true")]
        print(json.dumps([[o.returncode, o.stdout, o.stderr] for o in out]))
        """,
    )
    assert result == [[0, "script ran\n", ""], [0, "", ""]]


def test_folders_above_a_mount_are_open_to_calls(backend: Sandbox, policy: Policy, data_dir):
    """Folders made for a mount point deep in a new tree are 0755, so a call reaches the mount."""
    deep = Policy(
        agent_dir=policy.agent_dir,
        workdir=policy.workdir,
        mounts=(*policy.mounts, Mount.from_pair("/srv/deep/data", data_dir)),
        limits=policy.limits,
    )
    turn = backend.start(deep)
    try:
        result = py_json(
            turn,
            """
            import json, os
            modes = {p: oct(os.stat(p).st_mode & 0o7777) for p in ("/srv", "/srv/deep")}
            print(json.dumps([modes, open("/srv/deep/data/species.txt").read()]))
            """,
        )
    finally:
        turn.close()
    assert result == [{"/srv": "0o755", "/srv/deep": "0o755"}, "otter\nheron\n"]
