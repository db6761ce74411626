"""The Docker backend's pure decisions: container settings, commands, labels, digests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from astralvessel.sandbox import Limits, Mount, Policy
from astralvessel.sandbox._cgroup import turn_memory_bytes, turn_pids
from astralvessel.sandbox.docker._identity import identity_files
from astralvessel.sandbox.docker._spec import (
    CALL_UID,
    IDLE_ARGV,
    LABEL_OWNER,
    LABEL_TURN,
    VIEW_ROOT,
    carry_bytes,
    container_spec,
    context_digest,
    exec_argv,
    is_leftover,
    owner_label,
    parse_owner,
    profile_text,
    server_argv,
    view_binds,
)

PROFILE = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}


def _spec(policy: Policy, *, server: bool = True):
    return container_spec(
        policy, image="img", command=["python3", "-c", "x"], seccomp_profile=PROFILE,
        labels={LABEL_TURN: "1"}, server=server,
    )  # fmt: skip


def test_container_is_locked_down():
    """No network, read-only root, no capabilities, no_new_privs, no IPC, no logs."""
    config = _spec(Policy()).host_config
    assert config["network_mode"] == "none"
    assert config["read_only"] is True
    assert config["cap_drop"] == ["ALL"]
    assert "no-new-privileges" in config["security_opt"]
    assert config["ipc_mode"] == "none"
    assert config["log_config"] == {"Type": "none", "Config": {}}


def test_only_a_server_on_a_direct_channel_has_no_stdin():
    """The attach stream's server and docker-exec's idle shell read stdin; a direct channel's
    server reads its socket, and its container's stdin stays closed."""
    direct = container_spec(
        Policy(), image="img", command=["python3", "-c", "x"], seccomp_profile=PROFILE,
        labels={LABEL_TURN: "1"}, server=True, channel_dir="/run/host-folder",
    )  # fmt: skip
    assert direct.open_stdin is False
    assert _spec(Policy()).open_stdin is True
    assert _spec(Policy(), server=False).open_stdin is True


def test_seccomp_profile_is_passed_inline():
    """The compiled Docker profile travels as the seccomp security option's JSON."""
    options = _spec(Policy()).host_config["security_opt"]
    (seccomp,) = [o for o in options if o.startswith("seccomp=")]
    assert json.loads(seccomp.removeprefix("seccomp=")) == PROFILE


def test_a_profile_rendered_ahead_is_passed_as_it_is():
    """A backend renders its profile's 40 kB of JSON once per process; a turn's spec takes the text."""
    text = profile_text(PROFILE)
    rendered = container_spec(
        Policy(), image="img", command=["python3", "-c", "x"], seccomp_profile=text,
        labels={LABEL_TURN: "1"}, server=True,
    )  # fmt: skip
    assert f"seccomp={text}" in rendered.host_config["security_opt"]
    assert rendered.host_config == _spec(Policy()).host_config


def test_limits_become_engine_limits():
    """open_files and disk_mb become nofile and fsize ulimits; processes and memory cgroup limits."""
    limits = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)
    config = _spec(Policy(limits=limits)).host_config
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in config["ulimits"]}
    assert ulimits["nofile"] == (256, 256)
    assert ulimits["fsize"] == (16 << 20, 16 << 20)
    assert config["pids_limit"] > 48
    # The workspace tmpfs is charged to the container, so memory covers both.
    assert config["mem_limit"] >= (256 + 16) << 20
    assert config["memswap_limit"] == config["mem_limit"]


def test_container_bounds_are_the_turn_cgroups():
    """A container's memory and pids bounds are the namespace backends' turn cgroup bounds."""
    limits = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)
    for server in (True, False):
        config = _spec(Policy(limits=limits), server=server).host_config
        assert config["mem_limit"] == turn_memory_bytes(limits)
        assert config["pids_limit"] == turn_pids(limits)


def test_workspace_is_a_sized_tmpfs_owned_by_the_call_user():
    """The workspace is a tmpfs of exactly the disk limit, owned by uid 65534."""
    tmpfs = _spec(Policy(limits=Limits(disk_mb=16))).host_config["tmpfs"]
    options = tmpfs["/workspace"].split(",")
    assert f"size={16 << 20}" in options
    assert f"uid={CALL_UID}" in options


def test_agent_and_mounts_are_bound_read_only(tmp_path: Path):
    """/agent and data mounts are read-only binds; a writable mount stays writable."""
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    policy = Policy(
        agent_dir=tmp_path,
        workdir="/data",
        mounts=(
            Mount.from_pair("/data", tmp_path / "data"),
            Mount.from_pair("/out", tmp_path / "out", writable=True),
        ),
    )
    binds = _spec(policy).host_config["binds"]
    assert f"{tmp_path}:/agent:ro" in binds
    assert f"{tmp_path / 'data'}:/data:ro" in binds
    assert f"{tmp_path / 'out'}:/out:rw" in binds


def test_unmounted_workdir_is_an_empty_read_only_tmpfs():
    """A workdir no mount covers still exists, empty and read-only."""
    tmpfs = _spec(Policy(workdir="/data")).host_config["tmpfs"]
    assert tmpfs["/data"].startswith("ro,")


def test_server_mode_runs_as_nobody_with_its_view_root():
    """The server's container runs as 65534 and keeps no /proc masks, so calls can mount their own /proc."""
    spec = _spec(Policy())
    assert spec.user == f"{CALL_UID}:{CALL_UID}"
    assert VIEW_ROOT in spec.host_config["tmpfs"]
    assert not any(p.startswith("/proc") for p in spec.host_config_extra["MaskedPaths"])
    assert spec.host_config_extra["ReadonlyPaths"] == []


def test_exec_mode_keeps_dockers_masks_and_hides_sys():
    """docker-exec's idle process is a capability-less root; Docker's masks stay, /sys goes too."""
    spec = _spec(Policy(), server=False)
    assert spec.user == "0:0"
    masked = spec.host_config_extra["MaskedPaths"]
    assert {"/proc/kcore", "/proc/keys", "/sys", "/dev/mqueue"} <= set(masked)
    assert "ReadonlyPaths" not in spec.host_config_extra


def test_exec_mode_binds_the_turns_passwd_and_group():
    """docker-exec binds its turn's identity files over the image's; server mode never does."""
    spec = container_spec(
        Policy(),
        image="img",
        command=IDLE_ARGV,
        seccomp_profile={},
        labels={},
        server=False,
        uid=2_000_123,
        identity_dir="/run/etc-x",
    )
    binds = spec.host_config["binds"]
    assert "/run/etc-x/passwd:/etc/passwd:ro" in binds
    assert "/run/etc-x/group:/etc/group:ro" in binds
    served = container_spec(
        Policy(),
        image="img",
        command=["python3", "-c", "pass"],
        seccomp_profile={},
        labels={},
        server=True,
        identity_dir="/run/etc-x",
    )
    assert not any("/etc/passwd" in bind for bind in served.host_config["binds"])


def test_the_turns_passwd_names_its_uid_nobody_at_home_in_the_workspace():
    """The leased uid is nobody (and its gid nogroup), home /workspace; root is there too."""
    files = identity_files(2_000_123)
    assert files["passwd"].splitlines() == [
        "root:x:0:0:root:/workspace:/bin/sh",
        "nobody:x:2000123:2000123:nobody:/workspace:/bin/sh",
    ]
    assert files["group"].splitlines() == ["root:x:0:", "nogroup:x:2000123:"]


def test_environment_is_the_policy_environment():
    """The container's environment is exactly the policy's."""
    assert dict(_spec(Policy()).environment) == dict(Policy().environment)


def test_server_argv_runs_the_bootstrap_first():
    """The server's -c code is wrapped: user namespace and view first, the server's code after."""
    argv = server_argv(["python3", "-I", "-c", "print('server')", "42"], Policy())
    assert argv[:3] == ["python3", "-I", "-c"]
    assert argv[4] == "42"
    code = argv[3]
    assert code.index("_astralvessel_view(") < code.index("print('server')")
    compile(code, "<test>", "exec")


def test_view_binds_are_parents_first(tmp_path: Path):
    """The turn's binds are ordered so a parent is mounted before anything inside it."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    policy = Policy(
        workdir="/data",
        mounts=(
            Mount.from_pair("/data/inner", tmp_path / "a"),
            Mount.from_pair("/data", tmp_path / "b"),
        ),
    )
    assert view_binds(policy) == ["/data", "/workspace", "/data/inner"]


def test_exec_argv_clears_the_environment():
    """A docker-exec call starts from an empty environment plus exactly the policy's."""
    argv = exec_argv(Policy(), ["echo", "hi"])
    assert argv[:2] == ["/bin/sh", "-c"]
    assert 'exec env -i "$@" 2>&1' in argv[2]
    assert argv[-2:] == ["echo", "hi"]
    assigned = [a for a in argv[4:] if "=" in a]
    assert sorted(a.split("=")[0] for a in assigned) == sorted(Policy().environment)


def test_exec_argv_sets_the_calls_own_limits():
    """A docker-exec call gets the policy's address-space and process limits, as a server call does."""
    limits = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)
    script = exec_argv(Policy(limits=limits), ["true"])[2]
    assert "ulimit -v 262144" in script
    assert "ulimit -p 48" in script


def test_owner_label_round_trips():
    """An owner label parses back into host, pid and start time, even with colons in the host."""
    assert parse_owner(owner_label("host:with:colons", 42, "777")) == (
        "host:with:colons",
        42,
        "777",
    )
    assert parse_owner("nonsense") is None


def test_leftover_only_when_owner_is_dead_on_this_host():
    """A container is a leftover when its owner on this host is gone or its pid was reused."""
    labels = {LABEL_TURN: "1", LABEL_OWNER: owner_label("here", 10, "100")}
    assert is_leftover(labels, "here", lambda pid: None)
    assert is_leftover(labels, "here", lambda pid: "999")
    assert not is_leftover(labels, "here", lambda pid: "100")
    assert not is_leftover(labels, "elsewhere", lambda pid: None)
    assert not is_leftover({LABEL_OWNER: labels[LABEL_OWNER]}, "here", lambda pid: None)


def test_context_digest_follows_content():
    """The build cache key changes with any file, mode, the Dockerfile's name or the base image."""
    files = [("Dockerfile", 0o644, b"FROM x\n"), ("a.txt", 0o644, b"a")]
    base = context_digest(files, dockerfile="Dockerfile", base_image_id="sha256:1")
    assert base == context_digest(
        list(reversed(files)), dockerfile="Dockerfile", base_image_id="sha256:1"
    )
    assert base != context_digest(
        [*files[:1], ("a.txt", 0o644, b"b")], dockerfile="Dockerfile", base_image_id="sha256:1"
    )
    assert base != context_digest(
        [*files[:1], ("a.txt", 0o755, b"a")], dockerfile="Dockerfile", base_image_id="sha256:1"
    )
    assert base != context_digest(files, dockerfile="Dockerfile", base_image_id="sha256:2")


#: Words of any bytes but NUL: not UTF-8, printf's own escapes, newlines at the end.
BYTE_WORDS = [
    b"\xff\xfe",
    b"caf\xe9",
    b"\x80" * 255,
    b"new\nline\r\n\n",
    b"back\\slash \\0101 \\c %s %b",
    b"\x1b[31m\x07",
    "\u00fcn\u00ef \u2713".encode(),
    b"-n",
    b"plain",
]


def test_words_of_any_bytes_reach_the_shell_as_their_bytes():
    """Each word's bytes arrive, though the command sent is UTF-8 alone (as the engine's JSON)."""
    words = [os.fsdecode(word) for word in BYTE_WORDS]
    argv = carry_bytes('for a do printf "%s\\0" "$a"; done', words)
    for word in argv:
        word.encode("utf-8")
    done = subprocess.run(argv, capture_output=True, check=True)
    assert done.stdout.split(b"\0")[:-1] == BYTE_WORDS


def test_utf8_words_are_sent_as_they_are():
    """A command of UTF-8 words alone is passed unchanged, with no decoding step."""
    assert carry_bytes("exec \"$@\"", ["ls", "\u00e9t\u00e9"]) == [
        "/bin/sh", "-c", "exec \"$@\"", "sh", "ls", "\u00e9t\u00e9",
    ]  # fmt: skip


def test_a_call_with_byte_arguments_keeps_its_exec_command():
    """A docker-exec call's argument of non-UTF-8 bytes still gets its limits, env and argv."""
    name = os.fsdecode(b"/tmp/odd\xff")
    argv = exec_argv(Policy(), ["cat", "--", name], outbox="/workspace/outbox/1")
    assert "ulimit -p" in argv[2]
    assert "\\0377" in argv[-1]
    assert argv[4] == "0" * (len(argv) - 6) + "1"
