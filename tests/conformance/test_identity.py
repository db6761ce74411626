"""Promise: nothing in a call's view names the host: hostname, machine id, users, devices."""

from __future__ import annotations

import pwd
import socket
from pathlib import Path

from .calls import py_json, run

#: The only device entries a call sees, on every backend.
DEVICES = {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr"}


def test_hostname_is_the_sandbox_everywhere(session):
    """The UTS name, /etc/hostname and /etc/hosts all say ``sandbox``; /etc/machine-id is not the host's."""
    result = py_json(
        session,
        """
        import json, os, socket
        def read(path):
            try:
                return open(path).read().strip()
            except OSError as exc:
                return exc.errno
        print(json.dumps({
            "uname": os.uname().nodename,
            "gethostname": socket.gethostname(),
            "hostname": read("/etc/hostname"),
            "machine_id": read("/etc/machine-id"),
            "localhost": socket.gethostbyname("localhost"),
        }))
        """,
    )
    assert result["uname"] == result["gethostname"] == result["hostname"] == "sandbox"
    assert result["localhost"] == "127.0.0.1"
    host_id = (
        Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else None
    )
    assert result["machine_id"] != host_id
    assert socket.gethostname() not in (result["hostname"], result["machine_id"]) or (
        socket.gethostname() == "sandbox"
    )


#: Files that name the host (or this boot of it), where the kernel or a system offers them.
HOST_IDENTIFIERS = (
    "/proc/sys/kernel/random/boot_id",
    "/proc/cmdline",
    "/proc/sys/kernel/hostname",
    "/etc/hostname",
    "/etc/machine-id",
    "/var/lib/dbus/machine-id",
    "/sys/class/dmi/id/product_uuid",
    "/sys/class/dmi/id/product_serial",
    "/sys/class/dmi/id/board_serial",
    "/sys/devices/virtual/dmi/id/product_uuid",
)


def _host_values() -> set[str]:
    """What this host's identifying files hold (those it has and lets this process read)."""
    found = {socket.gethostname()}
    for path in HOST_IDENTIFIERS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text and text != "sandbox":
            found.add(text)
    return found


def test_no_file_names_the_host_or_its_boot(backend, policy):
    """No identifying file of /proc, /sys or /etc reads as the host's (its boot id, kernel
    command line, machine ids, DMI serials, hostname), and two turns read the same."""
    code = f"""
        import json
        def read(path):
            try:
                return open(path).read().strip()
            except OSError as exc:
                return exc.errno
        print(json.dumps({{path: read(path) for path in {list(HOST_IDENTIFIERS)!r}}}))
        """
    seen = []
    for _ in range(2):
        turn = backend.start(policy)
        try:
            seen.append(py_json(turn, code))
        finally:
            turn.close()
    assert seen[0] == seen[1]
    host = _host_values()
    assert "/proc/sys/kernel/random/boot_id" in seen[0]
    leaked = {path: value for path, value in seen[0].items() if value in host}
    assert not leaked, leaked


def test_no_host_user_is_listed(session):
    """The host's own users (and their homes) are not in the call's passwd."""
    result = py_json(
        session,
        """
        import json, os, pwd
        print(json.dumps({
            "uid": os.getuid(),
            "users": [[p.pw_name, p.pw_uid, p.pw_dir] for p in pwd.getpwall()],
        }))
        """,
    )
    host_people = {p.pw_name for p in pwd.getpwall() if 1000 <= p.pw_uid < 60000}
    assert host_people.isdisjoint(name for name, _uid, _home in result["users"])
    for name, uid, home in result["users"]:
        assert not home.startswith("/home/"), home
        # Only the call itself may be a high uid (docker-exec's: the turn's leased one).
        assert not (uid >= 1000 and uid != 65534) or (uid, name) == (result["uid"], "nobody")


def test_the_calls_uid_has_a_name(session):
    """The call's uid is a user of the call's passwd: nobody (or root, for a root identity).

    The shell's tools name it too, and its home is the turn's workspace; the
    environment has no ``USER`` (it holds only the documented variables).
    """
    result = py_json(
        session, "import json, os, pwd; print(json.dumps(pwd.getpwuid(os.getuid()).pw_name))"
    )
    assert result in ("nobody", "root")
    shell = run(session, "/bin/sh", "-c", 'whoami; id -un; echo "$HOME" "${USER-unset}"')
    assert shell.exit_code == 0, shell.output
    assert shell.output.split() == [result, result, "/workspace", "unset"]


def test_minimal_dev_without_terminals(session):
    """/dev holds only the harmless devices and descriptor links: no ptmx, no devpts, no tty, no shm."""
    result = py_json(
        session,
        """
        import json, os, pty
        try:
            pty.openpty()
            opened = "opened"
        except OSError as exc:
            opened = exc.errno
        print(json.dumps({"dev": sorted(os.listdir("/dev")), "openpty": opened}))
        """,
    )
    assert set(result["dev"]) == DEVICES
    assert result["openpty"] != "opened"


def test_common_tools_work_without_the_host_etc(session):
    """Python's TLS trust store, and git, curl and pip where the sandbox has them, still work."""
    result = py_json(
        session,
        """
        import json, os, ssl
        paths = ssl.get_default_verify_paths()
        context = ssl.create_default_context()
        if os.path.exists(paths.openssl_cafile):
            context.load_verify_locations(cafile=paths.openssl_cafile)
        installed = os.path.isdir("/usr/share/ca-certificates")
        print(json.dumps([installed, context.cert_store_stats()["x509_ca"]]))
        """,
    )
    installed, authorities = result
    # Where the system dirs hold the CA package, its bundle is reachable through /etc.
    assert authorities > 0 or not installed
    for argv in (
        ("git", "--version"),
        ("curl", "--version"),
        ("python3", "-m", "pip", "--version"),
    ):
        found = run(session, "/bin/sh", "-c", f"command -v {argv[0]}")
        if found.exit_code != 0:
            continue  # not installed in this sandbox's system dirs
        done = run(session, *argv)
        has_pip = "No module named pip" not in done.output
        assert done.exit_code == 0 or not has_pip, (argv, done.output)
    git = run(
        session,
        "/bin/sh",
        "-c",
        "command -v git >/dev/null || exit 0; cd /workspace && git init -q repo && cd repo"
        " && echo x > f && git add f && git -c user.name=a -c user.email=a@b commit -qm one"
        " && git log --format=%an",
    )
    assert git.exit_code == 0, git.output


def test_mountinfo_names_only_the_documented_host_paths(session, agent_dir, data_dir):
    """mountinfo names no host folder but the mounts' own and the interpreter's; no engine folder."""
    from astralvessel.sandbox._etc import etc_dir
    from astralvessel.sandbox._hostinfo import collect_host_facts, interpreter_mount

    facts = collect_host_facts()
    interpreter = interpreter_mount(facts.python, facts.system_dirs)
    # What docs/threat-model.md lists: a bind shows its source's path in its filesystem.
    documented = {str(agent_dir), str(data_dir), *([interpreter] if interpreter else [])}
    synthetic = etc_dir(facts.runtime_dir) + "/"
    private = ("/home/", "/root/", "/tmp/", "/var/", "/srv/", "/opt/", "/mnt/", "/media/")
    outcome = run(session, "/bin/cat", "/proc/self/mountinfo")
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.output.splitlines()
    assert len(lines) > 3
    for line in lines:
        fields = line.split()
        root, target = fields[3], fields[4]
        # The engine's per-container folder (and with it the container's id) never shows.
        assert "/var/lib/docker/containers" not in line, line
        for path in (root, target):
            if path in documented or path.startswith(synthetic):
                continue
            assert not path.startswith(private), line
