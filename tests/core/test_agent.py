"""Agent.load: every vessel.toml and tool file rule, and one ConfigError listing every problem."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from astralvessel import Agent, ConfigError, Executor, InputMode, Registry, Scope
from astralvessel.sandbox import Limits, Policy, Relaxations
from astralvessel.testing import FakeSandbox

from ..conftest import MakeAgent
from .conftest import ECHO_TOOL

MINIMAL = """
[tools]
declared = ["tools/echo.toml"]
"""


def problems_of(folder: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        Agent.load(folder)
    return list(info.value.problems)


def one_tool(make_agent: MakeAgent, tool: str) -> list[str]:
    return problems_of(make_agent(MINIMAL, {"tools/echo.toml": tool}))


def test_minimal_agent_takes_every_default(make_agent: MakeAgent) -> None:
    """A vessel.toml with only [tools] loads with the documented defaults."""
    agent = Agent.load(make_agent(MINIMAL, {"tools/echo.toml": ECHO_TOOL}))
    assert agent.name == "agent"
    assert agent.workdir == PurePosixPath("/workspace")
    assert agent.tool_timeout_seconds == 30
    assert agent.tool_output_chars == 30_000
    assert agent.scopes is None
    assert agent.limits == Limits(disk_mb=512, memory_mb=1024, processes=256, open_files=4096)
    (tool,) = agent.tools
    assert tool.name == "echo"
    assert tool.input is InputMode.JSON_STDIN
    assert tool.scope is Scope.READ
    assert tool.timeout_seconds is None
    assert dict(tool.parameters) == {"type": "object", "properties": {}}
    assert (agent.writable_root, agent.root_identity) == (False, False)


def test_every_vessel_key_is_read(make_agent: MakeAgent) -> None:
    """Each key DESIGN.md names for vessel.toml reaches the Agent."""
    folder = make_agent(
        """
        name = "guide"
        workdir = "/data"
        tool_timeout_seconds = 12.5
        tool_output_chars = 999
        scopes = ["tools:read", "tools:files"]
        [tools]
        builtin = ["read", "list"]
        declared = ["tools/echo.toml"]
        [limits]
        disk_mb = 64
        memory_mb = 256
        processes = 32
        open_files = 128
        [sandbox]
        dockerfile = "sandbox/Dockerfile"
        writable_root = true
        root_identity = true
        [services.catalog]
        url = "http://127.0.0.1:8080/tools"
        """,
        {"tools/echo.toml": ECHO_TOOL, "sandbox/Dockerfile": "FROM scratch\n"},
    )
    agent = Agent.load(folder)
    assert agent.name == "guide"
    assert agent.workdir == PurePosixPath("/data")
    assert agent.tool_timeout_seconds == 12.5
    assert agent.tool_output_chars == 999
    assert agent.scopes == {Scope.READ, Scope.FILES}
    assert agent.builtin == ("read", "list")
    assert agent.limits == Limits(disk_mb=64, memory_mb=256, processes=32, open_files=128)
    assert agent.dockerfile == folder / "sandbox" / "Dockerfile"
    assert agent.services["catalog"].url == "http://127.0.0.1:8080/tools"
    assert agent.writable_root
    assert agent.root_identity


def test_tool_file_keys_are_read(make_agent: MakeAgent) -> None:
    """input, timeout_seconds, scope and parameters of a tool file reach its ToolSpec."""
    folder = make_agent(
        MINIMAL,
        {
            "tools/echo.toml": """
            name = "echo"
            description = "Echo."
            command = ["{package}/echo.sh"]
            input = "args"
            timeout_seconds = 5
            scope = "tools:execute"
            [parameters]
            type = "object"
            [parameters.properties.word]
            type = "string"
            """
        },
    )
    (tool,) = Agent.load(folder).tools
    assert tool.input is InputMode.ARGS
    assert tool.timeout_seconds == 5
    assert tool.scope is Scope.EXECUTE
    assert tool.command == ("{package}/echo.sh",)
    assert tool.property_names == ("word",)


def test_broken_toml_names_file_and_line(make_agent: MakeAgent) -> None:
    """Broken TOML is reported with the file and the parser's line, not a traceback."""
    (problem,) = problems_of(make_agent("[tools]\ndeclared = [\n"))
    assert problem.startswith("vessel.toml: line ")
    assert "not valid TOML" in problem


def test_broken_tool_file_toml(make_agent: MakeAgent) -> None:
    """A tool file that is not TOML is named with its line."""
    (problem,) = one_tool(make_agent, 'name = "echo"\ndescription = \n')
    assert problem.startswith("tools/echo.toml: line 2")


@pytest.mark.parametrize(
    ("vessel", "expected"),
    [
        ("[tools]\ndeclard = []\n", "vessel.toml: tools.declard: unknown key (check the spelling)"),
        ("nmae = 'x'\n[tools]\n", "vessel.toml: nmae: unknown key (check the spelling)"),
        (
            "[tools]\n[limits]\ndisk = 5\n",
            "vessel.toml: limits.disk: unknown key (check the spelling)",
        ),
        (
            "tool_timeout_seconds = '30'\n[tools]\n",
            "vessel.toml: tool_timeout_seconds: expected a number, got a string",
        ),
        (
            "tool_output_chars = 1.5\n[tools]\n",
            "vessel.toml: tool_output_chars: expected an integer, got a number",
        ),
        ("[tools]\nbuiltin = 'read'\n", "vessel.toml: tools.builtin:"),
        ("name = 'x'\n", "vessel.toml: tools: required key is missing"),
        (
            "[tools]\n[limits]\nprocesses = true\n",
            "vessel.toml: limits.processes: expected an integer, got a boolean",
        ),
    ],
)
def test_vessel_shape_errors(make_agent: MakeAgent, vessel: str, expected: str) -> None:
    """Unknown keys and wrong types in vessel.toml each get a line naming the key."""
    problems = problems_of(make_agent(vessel))
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize(
    ("vessel", "expected"),
    [
        ("workdir = 'data'\n[tools]\n", "workdir: 'data' must be an absolute sandbox path"),
        ("workdir = '/usr/share'\n[tools]\n", "workdir: '/usr/share' is a system directory"),
        ("workdir = '/agent/x'\n[tools]\n", "workdir: '/agent/x' is inside /agent"),
        ("tool_timeout_seconds = 0\n[tools]\n", "tool_timeout_seconds: must be a positive number"),
        ("tool_output_chars = 0\n[tools]\n", "tool_output_chars: must be a positive number"),
        ("scopes = ['tools:root']\n[tools]\n", "scopes: unknown scope 'tools:root'"),
        ("[tools]\nbuiltin = ['cat']\n", "tools.builtin: unknown built-in 'cat'"),
        ("[tools]\nbuiltin = ['read', 'read']\n", "tools.builtin: lists a built-in more than once"),
        (
            "[tools]\n[limits]\nopen_files = 5000\n",
            "limits.open_files: limit open_files may not exceed 4096",
        ),
        (
            "[tools]\n[limits]\nmemory_mb = 0\n",
            "limits.memory_mb: limit memory_mb must be a positive integer",
        ),
        (
            "[tools]\n[services.x]\nurl = 'ftp://x'\n",
            "services.x.url: 'ftp://x' must be an http:// or https:// URL",
        ),
        ("[tools]\n[sandbox]\ndockerfile = 'nope'\n", "sandbox.dockerfile: 'nope' does not exist"),
    ],
)
def test_vessel_value_errors(make_agent: MakeAgent, vessel: str, expected: str) -> None:
    """Each vessel.toml value rule has its own message naming the key and what is accepted."""
    problems = problems_of(make_agent(vessel))
    assert f"vessel.toml: {expected}" in "\n".join(problems), problems


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ('description = "d"\ncommand = ["x"]\n', "name: required key is missing"),
        ('name = "echo"\ncommand = ["x"]\n', "description: required key is missing"),
        (
            'name = "Echo"\ndescription = "d"\ncommand = ["x"]\n',
            "name: 'Echo' is not a valid tool name",
        ),
        (
            'name = "9lives"\ndescription = "d"\ncommand = ["x"]\n',
            "name: '9lives' is not a valid tool name",
        ),
        (f'name = "a{"b" * 63}"\ndescription = "d"\ncommand = ["x"]\n', "is not a valid tool name"),
        (
            'name = "my-tool"\ndescription = "d"\ncommand = ["x"]\n',
            "name: 'my-tool' is not a valid tool name",
        ),
        (
            'name = "grep"\ndescription = "d"\ncommand = ["x"]\n',
            "name: 'grep' is a built-in tool's name",
        ),
        ('name = "echo"\ndescription = " "\ncommand = ["x"]\n', "description: must not be empty"),
        (
            'name = "echo"\ndescription = "d"\n',
            "command/service: set exactly one of command or service",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\nservice = "s"\n',
            "set exactly one of command or service",
        ),
        ('name = "echo"\ndescription = "d"\ncommand = []\n', "command: must list the program"),
        ('name = "echo"\ndescription = "d"\ncommand = "ls -l"\n', "command: "),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x", 1]\n',
            "command[1]: expected a string, got an integer",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\ninput = "argv"\n',
            'input: \'argv\' is not accepted; use "json-stdin" or "args"',
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\ntimeout_seconds = -1\n',
            "timeout_seconds: must be a positive number",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\nscope = "tools:all"\n',
            "scope: unknown scope 'tools:all'",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\ncolour = "red"\n',
            "colour: unknown key (check the spelling)",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\nparameters = 5\n',
            "parameters: must be a table",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\n[parameters]\ntype = "array"\n',
            'parameters: must be a JSON Schema with type = "object"',
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\n[parameters]\ntype = "object"\nrequired = "x"\n',
            "parameters: is not a valid JSON Schema",
        ),
        (
            'name = "echo"\ndescription = "d"\ncommand = ["x"]\n[parameters]\ntype = "object"\n[parameters.properties.a]\ntype = "strin"\n',
            "parameters: is not a valid JSON Schema at properties/a/type",
        ),
    ],
)
def test_tool_file_errors(make_agent: MakeAgent, tool: str, expected: str) -> None:
    """Each tool-file rule has its own message, prefixed with the tool file's path."""
    problems = one_tool(make_agent, tool)
    assert any(p.startswith("tools/echo.toml: ") and expected in p for p in problems), problems


def test_missing_tool_file(make_agent: MakeAgent) -> None:
    """A declared tool file that does not exist is named."""
    (problem,) = problems_of(make_agent(MINIMAL))
    assert (
        problem
        == "vessel.toml: tools.declared[0]: 'tools/echo.toml' does not exist in the agent folder"
    )


def test_tool_file_outside_folder_by_dotdot(make_agent: MakeAgent, tmp_path: Path) -> None:
    """A tool file path that climbs out of the agent folder is refused."""
    (tmp_path / "evil.toml").write_text(ECHO_TOOL)
    (problem,) = problems_of(make_agent('[tools]\ndeclared = ["../evil.toml"]\n'))
    assert "resolves outside the agent folder" in problem


def test_tool_file_outside_folder_by_symlink(make_agent: MakeAgent, tmp_path: Path) -> None:
    """A tool file that is a symlink to a file outside the agent folder is refused."""
    (tmp_path / "evil.toml").write_text(ECHO_TOOL)
    folder = make_agent('[tools]\ndeclared = ["tools/echo.toml"]\n')
    (folder / "tools").mkdir()
    (folder / "tools" / "echo.toml").symlink_to(tmp_path / "evil.toml")
    (problem,) = problems_of(folder)
    assert "resolves outside the agent folder" in problem


def test_absolute_tool_path_refused(make_agent: MakeAgent, tmp_path: Path) -> None:
    """An absolute tool file path is refused even when it exists."""
    (tmp_path / "evil.toml").write_text(ECHO_TOOL)
    (problem,) = problems_of(make_agent(f'[tools]\ndeclared = ["{tmp_path / "evil.toml"}"]\n'))
    assert "must be a path relative to the agent folder" in problem


def test_duplicate_names(make_agent: MakeAgent) -> None:
    """Two tool files with one name are refused, naming both files."""
    folder = make_agent(
        '[tools]\ndeclared = ["tools/a.toml", "tools/b.toml"]\n',
        {"tools/a.toml": ECHO_TOOL, "tools/b.toml": ECHO_TOOL},
    )
    (problem,) = problems_of(folder)
    assert problem == "tools/b.toml: name: 'echo' is already declared in tools/a.toml"


def test_service_without_entry(make_agent: MakeAgent) -> None:
    """A tool whose service names no [services] table is refused."""
    (problem,) = one_tool(make_agent, 'name = "echo"\ndescription = "d"\nservice = "catalog"\n')
    assert problem == (
        "tools/echo.toml: service: 'catalog' names no [services.catalog] table in vessel.toml "
        "(none are defined)"
    )


def test_every_problem_is_reported_at_once(make_agent: MakeAgent) -> None:
    """Problems in vessel.toml and several tool files all arrive in one ConfigError."""
    folder = make_agent(
        'tool_output_chars = 0\n[tools]\nbuiltin = ["cat"]\n'
        'declared = ["tools/a.toml", "tools/b.toml", "tools/missing.toml"]\n',
        {
            "tools/a.toml": 'name = "A"\ndescription = "d"\ncommand = ["x"]\n',
            "tools/b.toml": 'name = "b"\ndescription = "d"\ncommand = ["x"]\nscope = "nope"\n',
        },
    )
    problems = problems_of(folder)
    assert len(problems) == 5
    assert str(ConfigError(problems)).startswith("5 problems in the agent folder:")


def test_not_a_folder(tmp_path: Path) -> None:
    """Loading a path that is not a folder says so."""
    (problem,) = problems_of(tmp_path / "nothing")
    assert "not a folder" in problem


def test_missing_vessel_file(tmp_path: Path) -> None:
    """A folder without vessel.toml says what is missing."""
    (problem,) = problems_of(tmp_path)
    assert problem.startswith("vessel.toml: file not found")


def test_example_agent_loads() -> None:
    """The shipped example agent is valid."""
    agent = Agent.load(Path(__file__).parents[2] / "examples" / "field-guide")
    assert [t.name for t in agent.tools] == ["species", "word_count"]
    assert agent.tools[1].input is InputMode.ARGS


def test_vessel_error_does_not_hide_tool_file_problems(make_agent: MakeAgent) -> None:
    """A bad key in vessel.toml and a broken tool file are reported in the same pass."""
    folder = make_agent(
        """
        surprise = 1
        [tools]
        declared = ["tools/echo.toml"]
        """,
        {"tools/echo.toml": 'name = "Echo"\n'},
    )
    problems = problems_of(folder)
    assert any(p.startswith("vessel.toml:") and "surprise" in p for p in problems)
    assert any(p.startswith("tools/echo.toml:") for p in problems)


def test_oversized_vessel_file_is_refused_without_parsing(make_agent: MakeAgent) -> None:
    """A vessel.toml over 1 MiB is refused by its size, not parsed."""
    folder = make_agent(MINIMAL, {"tools/echo.toml": ECHO_TOOL})
    with (folder / "vessel.toml").open("a") as stream:
        stream.write("# " + "x" * (2 << 20) + "\n")
    assert problems_of(folder) == [f"vessel.toml: larger than {1 << 20} bytes; not a config file"]


def test_dangling_ref_fails_the_load(make_agent: MakeAgent) -> None:
    """A parameters schema with a $ref that resolves nowhere is a load problem."""
    tool = ECHO_TOOL + (
        '[parameters]\ntype = "object"\n[parameters.properties.v]\n"$ref" = "#/$defs/gone"\n'
    )
    (problem,) = one_tool(make_agent, tool)
    assert problem.startswith("tools/echo.toml: parameters: cannot be used to check arguments")


def test_eval_relaxations_must_be_booleans(make_agent: MakeAgent) -> None:
    """[sandbox] writable_root and root_identity take TOML booleans only, never "yes" or 1."""
    folder = make_agent(
        MINIMAL + '[sandbox]\nwritable_root = "yes"\nroot_identity = 1\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    found = "\n".join(problems_of(folder))
    assert "sandbox.writable_root" in found
    assert "sandbox.root_identity" in found


def test_sandbox_table_is_structured_into_the_policys_relaxations(make_agent: MakeAgent) -> None:
    """[sandbox]'s relaxations are the policy's own Relaxations value, each still an Agent
    attribute; the executor's policy takes them unless the host chooses otherwise."""
    folder = make_agent(
        MINIMAL + "[sandbox]\nwritable_root = true\ntool_servers = true\n",
        {"tools/echo.toml": ECHO_TOOL},
    )
    agent = Agent.load(folder)
    assert agent.relaxations == Relaxations(writable_root=True, tool_servers=True)
    assert type(agent.relaxations) is Relaxations
    assert (agent.writable_root, agent.root_identity, agent.tool_servers) == (True, False, True)
    registry = Registry.for_agent(agent)
    policy = Executor(registry, sandbox=FakeSandbox()).policy
    assert policy.relaxations == agent.relaxations
    host = Executor(registry, sandbox=FakeSandbox(), tool_servers=False, root_identity=True)
    assert host.policy.relaxations == Relaxations(writable_root=True, root_identity=True)
    # The policy's fields are the same value's: a Policy built in code passes the same checks.
    assert Policy(writable_root=True).relaxations == Relaxations(writable_root=True)
    with pytest.raises(TypeError, match="writable_root"):
        Policy(writable_root="yes")  # type: ignore[arg-type]


def test_every_sandbox_problem_has_its_path_in_one_pass(make_agent: MakeAgent) -> None:
    """Each wrong [sandbox] key is its own line under its path, beside the other tables'."""
    folder = make_agent(
        MINIMAL
        + '[sandbox]\nwritable_root = "yes"\nroot_identity = 1\ntool_server = true\n'
        + "tool_servers = [true]\ndockerfile = 3\n[limits]\nmemory_mb = 0\n"
        + '[network]\nallow = "example.com"\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    assert sorted(problems_of(folder)) == sorted(
        [
            "vessel.toml: sandbox.tool_server: unknown key (check the spelling)",
            "vessel.toml: sandbox.writable_root: expected a boolean, got a string",
            "vessel.toml: sandbox.root_identity: expected a boolean, got an integer",
            "vessel.toml: sandbox.tool_servers: expected a boolean, got an array",
            "vessel.toml: sandbox.dockerfile: expected a string, got an integer",
            "vessel.toml: limits.memory_mb: limit memory_mb must be a positive integer, not 0",
            "vessel.toml: network.allow: expected an array, got a string",
        ]
    )


def test_each_bad_network_pattern_is_named_where_it_stands(make_agent: MakeAgent) -> None:
    """[network] allow's bad entries are one problem each under their index, beside a wrong
    type in the same list, and the good entries hide none of them."""
    folder = make_agent(
        MINIMAL + '[network]\nallow = ["pypi.org", "bad host", 3, "x.org:99999", "pypi.org"]\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    problems = problems_of(folder)
    assert sorted(problems) == sorted(
        [
            "vessel.toml: network.allow[1]: network allow pattern 'bad host': is not a "
            "lowercase DNS name of at least two labels; write a host name such as pypi.org, "
            "optionally :PORT, or *.example.org for names below it",
            "vessel.toml: network.allow[2]: expected a string, got an integer",
            "vessel.toml: network.allow[3]: network allow port 99999 is not between 1 and 65535",
        ]
    )


def test_a_good_allow_list_reads_each_pattern_once(make_agent: MakeAgent) -> None:
    folder = make_agent(
        MINIMAL + '[network]\nallow = ["pypi.org", "*.example.org:8443", "pypi.org"]\n',
        {"tools/echo.toml": ECHO_TOOL},
    )
    agent = Agent.load(folder)
    assert [str(p) for p in agent.network_allow] == ["pypi.org", "*.example.org:8443"]


NINE_MISTAKES_VESSEL = """
workdir = "data"
tool_output_chars = "many"
surprise = true
[tools]
builtin = ["read", "gerp"]
declared = ["tools/a.toml", "tools/b.toml"]
[limits]
memory_mb = "big"
"""
NINE_MISTAKES_TOOLS = {
    "tools/a.toml": (
        'name = "Bad-Name"\ndescription = "d"\ncommand = ["x"]\ntimeout_seconds = "soon"\n'
        '[parameters]\ntype = "array"\n'
    ),
    "tools/b.toml": 'name = "grep"\ndescription = "d"\ncommand = ["x"]\nscope = 5\n',
}


def test_nine_mistakes_are_nine_problems_in_one_pass(make_agent: MakeAgent) -> None:
    """Type and value mistakes in vessel.toml and two tool files all arrive in one ConfigError."""
    problems = problems_of(make_agent(NINE_MISTAKES_VESSEL, NINE_MISTAKES_TOOLS))
    expected = [
        "vessel.toml: surprise: unknown key",
        "vessel.toml: tool_output_chars: expected an integer, got a string",
        "vessel.toml: limits.memory_mb: expected an integer, got a string",
        "vessel.toml: tools.builtin: unknown built-in 'gerp'; did you mean 'grep'?",
        "vessel.toml: workdir: 'data' must be an absolute sandbox path",
        "tools/a.toml: timeout_seconds: expected a number, got a string",
        "tools/a.toml: name: 'Bad-Name' is not a valid tool name",
        'tools/a.toml: parameters: must be a JSON Schema with type = "object"',
        "tools/b.toml: scope: expected a string, got an integer",
        "tools/b.toml: name: 'grep' is a built-in tool's name",
    ]
    for line in expected:
        assert any(p.startswith(line) for p in problems), (line, problems)
    assert len(problems) == len(expected)


@pytest.mark.parametrize(
    ("vessel", "tool", "expected"),
    [
        # A wrong type in one array element hides neither its neighbours nor the other keys.
        (
            '[tools]\nbuiltin = [1, "cat"]\ndeclared = ["tools/echo.toml"]\n',
            None,
            ["tools.builtin[0]: expected a string", "tools.builtin: unknown built-in 'cat'"],
        ),
        # A missing required table still lets the rest be checked.
        (
            'workdir = "/usr"\nscopes = ["x", 2]\n',
            None,
            [
                "tools: required key is missing",
                "workdir: '/usr' is a system directory",
                "scopes[1]: expected a string",
                "scopes: unknown scope 'x'",
            ],
        ),
        # A declared path of the wrong type does not stop the other tool files being read.
        (
            '[tools]\ndeclared = [3, "tools/echo.toml"]\n[services.s]\nurl = 7\n',
            'name = "Echo"\ndescription = "d"\nservice = "s"\n',
            [
                "tools.declared[0]: expected a string",
                "services.s.url: expected a string",
                "tools/echo.toml: name: 'Echo' is not a valid tool name",
            ],
        ),
        # A tool file missing its name still has its other keys checked.
        (
            None,
            'description = 5\ncommand = []\nscope = "tools:x"\n',
            [
                "name: required key is missing",
                "description: expected a string",
                "command: must list the program",
                "scope: unknown scope 'tools:x'",
            ],
        ),
    ],
)
def test_no_mistake_hides_another(
    make_agent: MakeAgent, vessel: str | None, tool: str | None, expected: list[str]
) -> None:
    """Orderings that once hid a problem until another was fixed report all of them at once."""
    folder = make_agent(vessel or MINIMAL, {"tools/echo.toml": tool or ECHO_TOOL})
    found = "\n".join(problems_of(folder))
    for line in expected:
        assert line in found, (line, found)
    assert len(found.splitlines()) == len(expected), found
