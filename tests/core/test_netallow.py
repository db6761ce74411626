"""The network allow-list: its pattern syntax, vessel.toml's [network] table, and the executor's."""

from __future__ import annotations

from pathlib import Path

import pytest

from astralvessel import Agent, Executor, Registry
from astralvessel._ground._netallow import HostPattern, parse_allow_list, permits
from astralvessel.errors import ConfigError, UsageError
from astralvessel.sandbox import Policy

from ._cli import bash_agent


@pytest.mark.parametrize(
    ("text", "host", "port", "allowed"),
    [
        ("pypi.org", "pypi.org", 443, True),
        ("pypi.org", "pypi.org", 80, True),
        ("pypi.org", "pypi.org", 8080, False),
        ("pypi.org", "www.pypi.org", 443, False),
        ("PyPI.org", "pypi.org", 443, True),
        ("pypi.org:8080", "pypi.org", 8080, True),
        ("pypi.org:8080", "pypi.org", 443, False),
        ("*.pythonhosted.org", "files.pythonhosted.org", 443, True),
        ("*.pythonhosted.org", "a.b.pythonhosted.org", 443, True),
        ("*.pythonhosted.org", "pythonhosted.org", 443, False),
        ("*.pythonhosted.org", "evilpythonhosted.org", 443, False),
        ("*.example.org:8443", "x.example.org", 8443, True),
        ("*.example.org:8443", "x.example.org", 443, False),
    ],
)
def test_pattern_matches(text, host, port, allowed):
    """Each pattern admits exactly its name (or the names below it) on exactly its ports."""
    assert HostPattern.parse(text).matches(host, port) is allowed


@pytest.mark.parametrize(
    "text",
    [
        "",
        "localhost",
        "10.0.0.1",
        "127.0.0.1:80",
        "[::1]",
        "::1",
        "http://pypi.org",
        "pypi.org/simple",
        "pypi.org.",
        "*",
        "*.org.",
        "a.*.org",
        "**.example.org",
        "pypi.org:0",
        "pypi.org:65536",
        "pypi.org:08",
        "pypi.org:http",
        "pypi.org:",
        "-bad.org",
        "exa mple.org",
        "pypi.org:80:80",
        "bücher.de",
        "user@pypi.org",
        "a" * 64 + ".org",
    ],
)
def test_bad_patterns_are_refused(text):
    """Addresses, URLs, paths, wildcards in the middle, bad ports and odd names are refused."""
    with pytest.raises(UsageError, match="network allow"):
        HostPattern.parse(text)


def test_pattern_invariants_hold_on_every_construction_path():
    """A pattern built directly is checked as one parsed from text is."""
    with pytest.raises(UsageError):
        HostPattern(host="10.0.0.1")
    with pytest.raises(UsageError):
        HostPattern(host="pypi.org", port=0)


def test_list_names_every_bad_entry_at_once():
    """One error lists every bad entry of a list, not only the first."""
    with pytest.raises(UsageError) as info:
        parse_allow_list(["pypi.org", "10.0.0.1", "pypi.org:99999"])
    assert "'10.0.0.1'" in str(info.value)
    assert "99999" in str(info.value)


def test_a_bare_string_is_not_a_list():
    """A single string given where a list belongs is refused rather than read letter by letter."""
    with pytest.raises(UsageError, match="list"):
        parse_allow_list("pypi.org")  # type: ignore[arg-type]


def test_permits_any_pattern():
    """A host is allowed when any pattern of the list allows it."""
    patterns = parse_allow_list(["pypi.org", "*.pythonhosted.org"])
    assert permits(patterns, "files.pythonhosted.org", 443)
    assert not permits(patterns, "github.com", 443)


def _agent(tmp_path: Path, network: str) -> Path:
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "vessel.toml").write_text(f'[tools]\nbuiltin = ["bash"]\n{network}')
    return folder


def test_agent_reads_the_network_table(tmp_path):
    """[network] allow in vessel.toml becomes the agent's patterns."""
    agent = Agent.load(_agent(tmp_path, '[network]\nallow = ["pypi.org", "*.example.org:8443"]\n'))
    assert [str(p) for p in agent.network_allow] == ["pypi.org", "*.example.org:8443"]


def test_agent_without_the_table_has_no_network(tmp_path):
    """An agent folder without [network] allows nothing."""
    assert Agent.load(_agent(tmp_path, "")).network_allow == ()


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('[network]\nallow = ["10.0.0.1"]\n', "network.allow"),
        ('[network]\nallow = "pypi.org"\n', "network.allow"),
        ('[network]\nallowed = ["pypi.org"]\n', "network"),
    ],
)
def test_agent_refuses_a_bad_network_table(tmp_path, table, expected):
    """A bad pattern, a string for the list or an unknown key fails Agent.load, naming the key."""
    with pytest.raises(ConfigError) as info:
        Agent.load(_agent(tmp_path, table))
    assert expected in str(info.value)


def test_executor_takes_the_agents_list(tmp_path):
    """Without network_allow, the executor's policy allows what the agent lists."""
    agent = Agent.load(_agent(tmp_path, '[network]\nallow = ["pypi.org"]\n'))
    executor = Executor(Registry.for_agent(agent), sandbox="bubblewrap")
    assert [str(p) for p in executor.policy.network_allow] == ["pypi.org"]


def test_host_list_replaces_the_agents(tmp_path):
    """The host's network_allow replaces the agent's list, and [] turns the network off."""
    agent = Agent.load(_agent(tmp_path, '[network]\nallow = ["pypi.org"]\n'))
    registry = Registry.for_agent(agent)
    other = Executor(registry, sandbox="bubblewrap", network_allow=["github.com"])
    off = Executor(registry, sandbox="bubblewrap", network_allow=[])
    assert [str(p) for p in other.policy.network_allow] == ["github.com"]
    assert off.policy.network_allow == ()
    assert "HTTP_PROXY" not in off.policy.environment


def test_executor_refuses_a_bad_list():
    """A bad pattern in network_allow raises UsageError when the executor is built."""
    with pytest.raises(UsageError, match="IP address"):
        Executor(Registry(), sandbox="bubblewrap", network_allow=["1.2.3.4"])


def test_policy_environment_has_proxy_variables_only_with_a_list():
    """The clean environment gains the proxy variables only when the policy allows a network."""
    plain = Policy()
    networked = Policy(network_allow=["pypi.org"])
    assert not any("proxy" in name.lower() for name in plain.environment)
    assert networked.environment["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert networked.environment["no_proxy"] == "localhost,127.0.0.1,::1"


def test_policy_identity_names_the_list():
    """Two policies differing only in their allow-lists have different identities."""
    assert Policy(network_allow=["a.org"]).identity != Policy(network_allow=["b.org"]).identity
    assert Policy().identity == Policy(network_allow=[]).identity


def test_unconfined_refuses_a_network_list(tmp_path):
    """The unconfined backend gives calls the host's network, so it refuses an allow-list."""
    from astralvessel.sandbox._discovery import get_backend

    policy = Policy(network_allow=["pypi.org"], egress_socket=tmp_path / "proxy.sock")
    with pytest.raises(UsageError, match="allow-list would mean nothing"):
        get_backend("unconfined").start(policy)


def test_check_reports_a_bad_network_pattern(cli, tmp_path):
    """`astralvessel check` fails an agent whose [network] allow holds an address, naming it."""
    folder = _agent(tmp_path, '[network]\nallow = ["pypi.org", "169.254.169.254"]\n')
    done = cli("check", str(folder))
    assert done.returncode == 2
    assert "vessel.toml: network.allow[1]: network allow pattern '169.254.169.254'" in done.stderr


def test_cli_call_takes_the_hosts_list(cli, tmp_path):
    """`call --network-allow` gives calls the proxy (which then tries, and fails, to resolve)."""
    agent = bash_agent(tmp_path)
    command = '{"command": "curl -sS http://nowhere.invalid/"}'
    done = cli(
        "call", str(agent), "bash", command, "--backend", "bubblewrap",
        "--network-allow", "nowhere.invalid",
    )  # fmt: skip
    assert "astralvessel egress proxy: nowhere.invalid does not resolve" in done.stdout


def test_cli_no_network_overrides_the_agent(cli, tmp_path):
    """`call --no-network` removes the network an agent's [network] allow asks for."""
    agent = bash_agent(tmp_path)
    (agent / "vessel.toml").write_text(
        '[tools]\nbuiltin = ["bash"]\n[network]\nallow = ["a.org"]\n'
    )
    command = '{"command": "env | grep -ci proxy || true"}'
    with_list = cli("call", str(agent), "bash", command, "--backend", "bubblewrap")
    without = cli("call", str(agent), "bash", command, "--backend", "bubblewrap", "--no-network")
    assert with_list.stdout.startswith("6\n")
    assert without.stdout.startswith("0\n")
