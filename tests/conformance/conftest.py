"""One conformance suite, run against every confined backend and every session that ships.

``BACKENDS`` is the only list: a backend joins the suite by adding its name. Each
test gets a fresh turn (``session``) of the backend under test, built from a
real agent folder and a read-only data mount in ``tmp_path``, and closed after.

A backend that runs in a declared, degraded mode (``docker-exec``: no sandbox
server) lists in ``DECLARED_UNKEPT`` the tests it fails and why; each becomes a
strict expected failure, so the day one passes the suite says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry, Turn
from astralvessel.sandbox import Limits, Mount, Policy, Sandbox, SandboxSession
from astralvessel.sandbox._discovery import get_backend

#: Every backend the suite runs on; a backend that cannot run here fails, never skips.
BACKENDS = ["bubblewrap", "nsjail", "docker", "docker-exec"]

_NO_SERVER = "docker-exec runs no sandbox server"
#: test_files.py's tests: the file primitives live in the sandbox server's file worker.
_FILE_PRIMITIVE_TESTS = (
    "test_binary_round_trip",
    "test_file_larger_than_one_chunk_round_trips",
    "test_text_is_written_as_utf8",
    "test_read_past_the_bound_is_refused",
    "test_missing_file_is_file_not_found",
    "test_folder_is_a_directory_error",
    "test_file_in_the_way_is_not_a_directory",
    "test_unreadable_file_is_permission_error",
    "test_writes_outside_the_writable_places_are_refused",
    "test_read_outside_the_agent_data_is_refused",
    "test_link_at_the_name_is_never_followed",
    "test_linked_folder_cannot_lead_a_write_outside",
    "test_hostile_names_round_trip",
    "test_too_long_name_is_refused",
    "test_written_file_belongs_to_the_calls",
    "test_list_dir_names_entries_and_kinds",
    "test_parents_are_made_inside_the_workspace_only",
    "test_writable_root_opens_the_root_to_writes",
    "test_links_swapped_under_file_operations_never_lead_outside",
    "test_write_past_the_disk_leaves_the_file_empty_and_room",
    # test_file_names.py: names of any bytes, and listings that say when they were cut.
    "test_listed_names_reach_the_same_files",
    "test_host_names_arrive_as_their_bytes",
    "test_name_lengths_are_the_kernels",
    "test_dot_dot_names_a_folder_not_a_file",
    "test_a_listing_past_its_limit_says_it_was_cut",
    "test_a_folder_past_ten_thousand_entries_is_never_cut_silently",
    # test_file_errors.py: the error table.
    "test_the_error_table_holds",
)
#: Per backend, the tests of promises it declares it cannot keep (test name: why).
DECLARED_UNKEPT: dict[str, dict[str, str]] = {
    "docker-exec": {
        "test_cannot_stop_kill_or_read_its_own_init": (
            f"{_NO_SERVER}: a call has no init of its own; it joins the container's PID namespace "
            "and sees its idle first process (process-isolation, declared by probe)"
        ),
        "test_securebits_locked": (
            f"{_NO_SERVER} to lock the securebits before exec: a call starts with the engine's "
            "(no capabilities and no_new_privs, but the bits unlocked)"
        ),
        "test_root_shows_only_the_documented_tree": (
            f"{_NO_SERVER} to build the call's view: a call sees the image's whole (read-only) root"
        ),
        "test_minimal_dev_without_terminals": (
            f"{_NO_SERVER} to build the call's /dev: a call sees the container's (tty, ptmx, "
            "pts, mqueue masked but listed)"
        ),
        "test_writable_mount_is_nosuid_and_nodev": (
            f"{_NO_SERVER} to remount binds nosuid,nodev (Docker's binds take neither); "
            "no_new_privs still makes a set-id file grant nothing"
        ),
        "test_memory_limit_holds_for_the_whole_turn": (
            f"{_NO_SERVER} to watch the turn's memory: the container's memory cgroup "
            "(memory_mb + disk_mb + 128 MiB) is the bound, and its OOM kills are not reported"
        ),
        "test_an_exec_the_memory_limit_stops_says_so": (
            f"{_NO_SERVER} to watch the turn's memory: the container's memory cgroup "
            "(memory_mb + disk_mb + 128 MiB) is the bound, and its OOM kills are not reported"
        ),
        "test_memory_stop_is_limit": (
            f"{_NO_SERVER} to watch the turn's memory: the container's memory cgroup "
            "(memory_mb + disk_mb + 128 MiB) is the bound, and its OOM kills are not reported"
        ),
        "test_pipe_buffers_count_against_the_turns_memory": (
            f"{_NO_SERVER} to watch the turn's memory: pipe buffers count only against the "
            "container's memory cgroup (memory_mb + disk_mb + 128 MiB)"
        ),
        "test_a_call_cannot_hide_its_memory_from_the_watch": (
            f"{_NO_SERVER} to watch the turn's memory: what a call's processes hold, hidden or "
            "not, counts only against the container's memory cgroup (memory_mb + disk_mb + 128 MiB)"
        ),
        "test_a_full_disk_is_limit": (
            f"{_NO_SERVER} to see a call fill the workspace: a full disk is the command's own "
            "failure"
        ),
        "test_processes_at_their_bound_are_limit": (
            f"{_NO_SERVER} to count a call's processes: forks refused at the bound are the "
            "command's own failure"
        ),
        "test_mountinfo_names_only_the_documented_host_paths": (
            f"{_NO_SERVER} to build the call's view: a call sees the container's mountinfo, with "
            "the engine's binds from /var/lib/docker/containers/ID"
        ),
        "test_file_tools_see_the_sandbox_view": f"{_NO_SERVER}: the file tools are unavailable",
        "test_file_names_from_file_tools_are_escaped": (
            f"{_NO_SERVER}: the file tools are unavailable"
        ),
        # grep runs as a command, as on every backend; the other three need the file worker.
        **dict.fromkeys(
            (
                f"test_builtin_tools_act_on_hostile_names[{tool}]"
                for tool in ("read", "list", "glob")
            ),
            f"{_NO_SERVER}: the file tools are unavailable",
        ),
        "test_sees_only_its_own_processes": (
            f"{_NO_SERVER}: a call joins the container's PID namespace and sees its idle first "
            "process and that process's stdin reader (both root, which it cannot signal)"
        ),
        "test_kill_everything_leaves_server_alive": (
            f"{_NO_SERVER}: a call has no init of its own, so its kill(-1) ends every other "
            "process of the turn's uid but not the call itself"
        ),
        "test_the_list_tool_reads_a_crowded_folder_only_to_its_bound": (
            f"{_NO_SERVER}: the file tools are unavailable"
        ),
        "test_sixteen_execs_run_at_once": f"{_NO_SERVER}: commands run one at a time",
        **dict.fromkeys(
            _FILE_PRIMITIVE_TESTS,
            f"{_NO_SERVER}: the file primitives are unavailable (the docker backend has them)",
        ),
        "test_calls_are_uid_65534_inside": (
            f"{_NO_SERVER} to map a call's ids: calls are the turn's own leased host uid, which "
            "the turn's passwd names nobody (a shared 65534 would share the kernel's per-uid "
            "process limit among all turns)"
        ),
    },
}

#: The allow-listed network needs the server's relay; docker-exec declares it unkept.
_NETWORK_TESTS = (
    "test_calls_get_the_proxy_variables",
    "test_listed_host_is_reached_over_http",
    "test_listed_host_is_reached_over_https",
    "test_unlisted_host_is_refused",
    "test_listed_host_on_another_port_is_refused",
    "test_ip_address_is_refused",
    "test_name_resolving_to_a_private_address_is_refused",
    "test_direct_connections_still_go_nowhere",
    "test_absurd_requests_get_a_refusal",
    "test_slow_request_head_is_cut_off",
    "test_proxy_in_a_long_temporary_folder_serves_and_dies_with_its_turn",
    "test_loopback_stays_refused_without_the_operators_rule",
    "test_ipv6_and_private_literals_are_refused_by_name_rule",
    "test_names_resolving_to_reserved_ipv6_are_refused",
    "test_refusals_reach_the_model",
    "test_a_flood_of_refusals_is_bounded",
    "test_no_request_reaches_the_origin_with_the_calls_host",
    "test_connect_to_port_80_is_refused",
    "test_another_local_user_cannot_use_the_turns_proxy",
    # test_host_service.py: a service on the host, by name.
    "test_a_pinned_host_service_is_reached_by_name",
    "test_the_pinned_address_is_admitted_on_the_names_ports_only",
)
DECLARED_UNKEPT["docker-exec"].update(
    dict.fromkeys(
        _NETWORK_TESTS,
        f"{_NO_SERVER} to relay calls to the egress proxy: a turn with a network allow-list "
        "refuses to start (use the docker backend)",
    )
)


DECLARED_UNKEPT["docker-exec"].update(
    {
        "test_loopback_tcp_buffers_count_against_the_turns_memory": (
            f"{_NO_SERVER} to count socket buffers, and cgroup v1 charges TCP's to the "
            "container's group only under a kernelTCP limit this engine's runtime does not set"
        ),
        "test_unix_pair_buffers_count_against_the_turns_memory": (
            f"{_NO_SERVER} to count socket buffers: only the container's memory cgroup "
            "(memory_mb + disk_mb + 128 MiB) holds them, and its OOM kills are not reported"
        ),
        "test_netlink_answers_count_against_the_turns_memory": (
            f"{_NO_SERVER} to count socket buffers: only the container's memory cgroup may "
            "hold them, and its OOM kills are not reported"
        ),
        "test_epoll_watches_count_against_the_turns_memory": (
            f"{_NO_SERVER} to count epoll watches: only the container's memory cgroup "
            "(memory_mb + disk_mb + 128 MiB) holds them, and its OOM kills are not reported"
        ),
    }
)
DECLARED_UNKEPT["docker-exec"]["test_helpers_cannot_take_another_process_s_descriptors"] = (
    f"{_NO_SERVER}: no file worker or egress relay to confine (a turn with a network "
    "allow-list refuses to start)"
)
DECLARED_UNKEPT["docker-exec"]["test_calls_beside_the_server_cannot_read_it"] = (
    f"{_NO_SERVER}: its calls are the turn's own host uid with no capabilities, beside no server "
    "(a turn with a network allow-list, as this test's, refuses to start)"
)


#: test_detached.py's tests that start a process: detached processes live in the server.
_DETACHED_TESTS = (
    "test_detached_process_returns_at_once_and_reports_its_exit",
    "test_detached_process_outlives_the_call_that_started_it",
    "test_a_forked_daemon_lives_on_confined",
    "test_detached_processes_die_with_their_turn",
    "test_kill_takes_the_whole_tree",
    "test_detached_timeout_kills_the_whole_tree",
    "test_the_turn_holds_a_bounded_number",
    "test_a_process_that_left_nothing_running_frees_its_slot_by_its_result",
    "test_limits_hold_for_a_detached_process",
    "test_memory_watch_stops_a_detached_process",
    "test_log_is_bounded",
    "test_missing_command_is_a_failed_result",
    "test_async_start_and_result",
    "test_no_detached_process_outlives_a_killed_host",
)
DECLARED_UNKEPT["docker-exec"].update(
    dict.fromkeys(
        _DETACHED_TESTS,
        f"{_NO_SERVER} to keep a detached process's namespace: Turn.start raises "
        "BackendUnavailableError (use the docker backend)",
    )
)

#: test_snapshots.py's tests: capture and restore are the file worker's.
_SNAPSHOT_TESTS = (
    "test_a_turn_opened_from_a_snapshot_has_its_files",
    "test_a_links_target_stays_in_the_sandbox",
    "test_a_forks_writes_reach_neither_its_siblings_nor_its_parent",
    "test_forks_racing_each_other_stay_apart",
    "test_a_fork_changes_neither_the_snapshots_tree_nor_its_siblings",
    "test_a_forks_writes_count_against_its_disk_limit",
    "test_a_snapshot_of_a_fork_is_the_forks_files",
    "test_a_writable_root_turn_opens_from_a_snapshot_by_copy",
    "test_the_mechanism_is_the_backends",
    "test_a_fifo_is_refused_by_name",
    "test_set_id_bits_never_come_back",
    "test_many_small_files_come_back",
    "test_a_fork_nested_900_folders_deep_is_snapshotted_whole",
    "test_a_snapshot_is_a_value_named_by_its_files",
    "test_the_budget_refuses_a_snapshot_past_it",
    "test_a_sparse_file_counts_its_holes",
    "test_a_snapshot_past_the_turns_disk_is_refused",
    "test_wrong_arguments_are_the_hosts_mistake",
    "test_warm_turns_start_with_the_executors_snapshot",
    "test_a_saved_snapshot_opens_in_another_process",
    "test_a_fork_of_an_unstarted_fork_is_the_same_snapshot",
    "test_a_forks_outbox_holds_none_of_its_parents_files",
    # test_snapshot_reuse.py's
    "test_a_second_snapshot_links_what_did_not_change",
    "test_a_file_changed_between_two_snapshots_is_read_again",
    "test_a_file_changed_in_the_captures_tick_is_read_again",
    "test_a_forks_snapshot_links_only_what_it_did_not_change",
    "test_a_fork_of_a_linked_snapshot_changes_no_tree",
    "test_the_snapshots_of_a_fresh_turns_forks_link_the_same_files",
    "test_a_fresh_turns_snapshot_after_its_fork_links_what_it_did_not_change",
    # test_snapshot_budget.py's
    "test_a_fork_holds_its_turns_files_once",
    "test_a_snapshot_past_the_budget_leaves_nothing",
    "test_dropped_snapshots_give_their_bytes_back",
    # test_fork_ahead.py's
    "test_a_forks_first_call_takes_the_sandbox_started_ahead",
    "test_forks_started_ahead_stay_apart",
    "test_sandboxes_started_ahead_die_with_the_executor",
    "test_sandboxes_started_ahead_go_with_the_forks_snapshot",
    "test_a_call_right_after_fork_takes_the_sandbox_started_ahead",
    "test_first_calls_of_eight_forks_from_eight_threads_each_get_one_sandbox",
    "test_a_failed_start_ahead_falls_back_to_a_cold_start",
    "test_when_every_start_fails_the_forks_first_call_raises_the_one_error",
    "test_closing_a_fork_ends_its_calls_wait_for_the_start_ahead",
    "test_fork_with_ready_n_returns_with_every_forks_sandbox_started",
    "test_a_fork_of_an_unstarted_fork_grows_the_pool_they_share",
    "test_afork_with_ready_n_returns_with_every_forks_sandbox_started",
    "test_fork_with_ready_0_returns_before_any_start",
    "test_a_failing_start_never_holds_fork_ready_n_up",
    "test_a_hanging_start_holds_fork_ready_n_only_for_its_bound",
    "test_closing_ends_fork_ready_ns_wait",
)
DECLARED_UNKEPT["docker-exec"].update(
    dict.fromkeys(
        _SNAPSHOT_TESTS,
        f"{_NO_SERVER} to list, read and restore the workspace: Turn.snapshot and a turn "
        "opened from a snapshot raise BackendUnavailableError (use the docker backend)",
    )
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each declared-unkept test of a backend as a strict expected failure, with its reason."""
    # A declaration names a test function, not a module: a name two modules share would
    # mark both, and the one that passes would fail the suite as a strict XPASS.
    # Only the suite's own items (run per backend) count: the hook sees the whole session's,
    # and a test elsewhere (tests/web has one) may share a name with a declared one.
    declared = {name.partition("[")[0] for unkept in DECLARED_UNKEPT.values() for name in unkept}
    modules: dict[str, set[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "backend" not in callspec.params:
            continue
        if item.originalname in declared:  # type: ignore[attr-defined]
            modules.setdefault(item.originalname, set()).add(item.module.__name__)  # type: ignore[attr-defined]
    shared = {name: sorted(found) for name, found in modules.items() if len(found) > 1}
    if shared:
        raise pytest.UsageError(f"declared-unkept test names in several modules: {shared}")
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("backend") if callspec is not None else None
        unkept = DECLARED_UNKEPT.get(str(name), {})
        # A declaration names a test, or one case of it: "test[param]" (its other parameters).
        others = (
            "-".join(str(v) for k, v in callspec.params.items() if k != "backend")
            if callspec
            else ""
        )
        why = unkept.get(f"{item.originalname}[{others}]", unkept.get(item.originalname))  # type: ignore[attr-defined]
        if why is not None:
            item.add_marker(pytest.mark.xfail(strict=True, reason=why))


#: The workdir the test agent declares; the data folder is mounted there read-only.
WORKDIR = "/data"
#: Limits small enough that the limit tests reach them in a moment.
TEST_LIMITS = Limits(disk_mb=16, memory_mb=256, processes=48, open_files=256)


#: One instance of each backend for the whole run, as a host holds one for its turns: what
#: it learns once (a Docker engine's connection, whether its container uids are mapped, its
#: sweep of dead hosts' containers) is not asked again per test, 0.1-0.3 s each on Docker at
#: load 11. Each test still gets a turn of its own; the order of the tests is unchanged.
_INSTANCES: dict[str, Sandbox] = {}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Sandbox:
    """The backend under test, found the way a host finds it: by name."""
    name = str(request.param)
    if name not in _INSTANCES:
        _INSTANCES[name] = get_backend(name)
    return _INSTANCES[name]


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    """A small agent folder: a manifest and one tool script."""
    agent = tmp_path / "agent"
    (agent / "tools").mkdir(parents=True)
    (agent / "vessel.toml").write_text(
        'name = "conformance"\nworkdir = "/data"\n\n[tools]\nbuiltin = ["bash"]\n'
    )
    (agent / "tools" / "hello.py").write_text("print('hello from the agent folder')\n")
    # World-readable, as an agent folder a host ships would be.
    for path in (tmp_path, agent, agent / "tools"):
        path.chmod(0o755)
    return agent


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The host data mounted read-only at the workdir."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "species.txt").write_text("otter\nheron\n")
    data.chmod(0o755)
    (data / "species.txt").chmod(0o644)
    return data


@pytest.fixture
def policy(agent_dir: Path, data_dir: Path) -> Policy:
    """The policy of a typical turn, with small limits."""
    return Policy(
        agent_dir=agent_dir,
        workdir=WORKDIR,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        limits=TEST_LIMITS,
    )


@pytest.fixture
def session(backend: Sandbox, policy: Policy) -> Iterator[SandboxSession]:
    """A running turn of the backend under test, closed after the test."""
    turn = backend.start(policy)
    try:
        yield turn
    finally:
        turn.close()


def suite_executor(
    backend: Sandbox, agent_dir: Path, data_dir: Path, **options: object
) -> Executor:
    """An executor of the backend under test with the suite's policy (its mounts, limits and
    timeout); ``options`` are more ``Executor`` arguments, ``limits`` among them."""
    return Executor(
        Registry.for_agent(Agent.load(agent_dir)),
        sandbox=backend,
        mounts=(Mount.from_pair(WORKDIR, data_dir),),
        timeout_seconds=30.0,
        **{"limits": TEST_LIMITS, **options},  # type: ignore[arg-type]
    )


@pytest.fixture
def executor(backend: Sandbox, agent_dir: Path, data_dir: Path) -> Iterator[Executor]:
    """An executor of the backend under test with the suite's policy."""
    with suite_executor(backend, agent_dir, data_dir) as opened:
        yield opened


@pytest.fixture
def turn(executor: Executor) -> Iterator[Turn]:
    """A turn of the backend under test, opened through the public API with the same policy."""
    with executor.turn() as opened:
        yield opened


@pytest.fixture
def host_secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """A secret the host process holds in its environment while the turn starts."""
    secret = f"host-secret-{os.getpid()}-{os.urandom(4).hex()}"
    monkeypatch.setenv("ASTRALVESSEL_TEST_SECRET", secret)
    return secret
