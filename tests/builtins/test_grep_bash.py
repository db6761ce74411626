"""grep with ripgrep and with the grep -rnE fallback (same output), and bash's request and result."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from astralvessel.builtins import BUILTINS, GREP_MAX, bash_request, grep_request
from astralvessel.results import grep_text, render_command
from astralvessel.sandbox import RunOutcome

from .conftest import CANARY, Tree

Grep = Callable[..., "tuple[str, bool]"]


def _run(argv: list[str], cwd: Path) -> tuple[str, int]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    # The sandbox cuts lines in bytes and decodes with replacement, as here.
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    return output, done.returncode


@pytest.fixture(params=["rg", "grep"])
def grep(request: pytest.FixtureRequest, tree: Tree) -> Grep:
    """Run the grep built-in's argv for real, with ripgrep or with the fallback."""

    def run(**arguments: Any) -> tuple[str, bool]:
        argv, stdin = grep_request(
            arguments,
            workdir=str(tree.data),
            visible_roots=[str(tree.data), str(tree.workspace)],
            engine=request.param,
        )
        assert stdin == b""
        return grep_text(*_run(argv, tree.data))

    return run


@pytest.fixture
def notes(tree: Tree) -> Tree:
    """Files whose order tells a per-directory name sort from a plain path sort."""
    files = {
        "a/x.md": "hello world\n",
        "a-b/x.md": "hello there\nbye\n",
        "b.txt": "say Hello\n",
        ".hidden/h.md": "hello hidden\n",
        "bin.dat": "hello\x00binary\n",
    }
    for rel, text in files.items():
        (tree.data / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree.data / rel).write_text(text)
    return tree


def test_grep_prints_path_line_text(notes: Tree, grep: Grep) -> None:
    """Matches are path:line:text, relative to the workdir, in name order per directory."""
    assert grep(pattern="hello") == (
        ".hidden/h.md:1:hello hidden\na/x.md:1:hello world\na-b/x.md:1:hello there",
        False,
    )


def test_grep_path_is_a_file_or_a_directory(notes: Tree, grep: Grep) -> None:
    """path narrows the search to a file or a directory, shown as given."""
    assert grep(pattern="hello", path="a") == ("a/x.md:1:hello world", False)
    assert grep(pattern="bye", path="a-b/x.md") == ("a-b/x.md:2:bye", False)
    absolute = str(notes.data / "a")
    assert grep(pattern="hello", path=absolute + "/") == (f"{absolute}/x.md:1:hello world", False)


def test_grep_glob_limits_the_files(notes: Tree, grep: Grep) -> None:
    """glob keeps only files whose name matches."""
    assert grep(pattern="ello", glob="*.txt") == ("b.txt:1:say Hello", False)


def test_grep_ignore_case(notes: Tree, grep: Grep) -> None:
    """ignore_case matches letters regardless of case; the default is case-sensitive."""
    assert "b.txt:1:say Hello" not in grep(pattern="hello")[0]
    assert "b.txt:1:say Hello" in grep(pattern="hello", ignore_case=True)[0]


def test_grep_max_results_defaults_to_100(tree: Tree, grep: Grep) -> None:
    """Without max_results, 100 lines come back, then a note that more matched."""
    (tree.data / "many.txt").write_text("match\n" * 150)
    lines = grep(pattern="match")[0].splitlines()
    assert len(lines) == 101
    assert lines[99] == "many.txt:100:match"
    assert lines[100].startswith("[more than 100 matching lines")


def test_grep_max_results_is_at_most_1000(tree: Tree, grep: Grep) -> None:
    """The schema caps max_results at 1000, and a larger value is clamped to it."""
    assert BUILTINS["grep"].parameters["properties"]["max_results"]["maximum"] == GREP_MAX == 1000
    (tree.data / "many.txt").write_text("match\n" * 1200)
    lines = grep(pattern="match", max_results=5000)[0].splitlines()
    assert len(lines) == 1001


def test_grep_cuts_each_line_at_400_columns(tree: Tree, grep: Grep) -> None:
    """Every result line, path included, is at most 400 characters."""
    (tree.data / "long.txt").write_text("é" * 5000 + "\n")
    text, _ = grep(pattern="é")
    assert text == ("long.txt:1:" + "é" * 5000)[:400]


def test_no_match_is_not_an_error(notes: Tree, grep: Grep) -> None:
    """Nothing matching is a plain answer."""
    assert grep(pattern="zebra") == ("No matches found.", False)


def test_invalid_pattern_is_an_error(notes: Tree, grep: Grep) -> None:
    """A pattern that does not compile is the model's mistake, with the engine's reason."""
    text, is_error = grep(pattern="(unclosed")
    assert is_error
    assert text.startswith("Invalid pattern (unclosed:")


def test_binary_files_are_skipped_and_refused_by_name(notes: Tree, grep: Grep) -> None:
    """Binary files are skipped in a directory and refused when named."""
    assert "bin.dat" not in grep(pattern="binary")[0]
    text, is_error = grep(pattern="hello", path="bin.dat")
    assert is_error
    assert "binary" in text


def test_missing_path_is_an_error(notes: Tree, grep: Grep) -> None:
    """A path that does not exist says so."""
    assert grep(pattern="x", path="nope") == ("nope does not exist.", True)


def test_grep_outside_the_data_is_refused(notes: Tree, grep: Grep) -> None:
    """Absolute paths, '..' and links leading outside the visible roots are refused."""
    (notes.data / "escape").symlink_to(notes.outside)
    for path in (
        str(notes.outside),
        "../outside",
        "escape",
        "/proc/self/root" + str(notes.outside),
    ):
        text, is_error = grep(pattern=CANARY, path=path)
        assert is_error, path
        assert "outside the agent's data" in text
        assert f":{CANARY}" not in text


def test_grep_does_not_follow_links_inside_a_directory(notes: Tree, grep: Grep) -> None:
    """A link met while searching a directory is not followed."""
    (notes.data / "escape").symlink_to(notes.outside)
    (notes.data / "file-link").symlink_to(notes.canary)
    assert grep(pattern=CANARY) == ("No matches found.", False)


def test_the_models_values_never_reach_the_script_text(tree: Tree, grep: Grep) -> None:
    """Shell syntax in the pattern, path and glob is data, never run."""
    (tree.data / "a.txt").write_text("$(touch pwned)\n")
    grep(pattern="$(touch pwned)", glob="$(touch pwned2)")
    grep(pattern="x", path="'; touch pwned3; '")
    assert not any(tree.data.glob("pwned*"))


def test_a_pattern_starting_with_a_dash_is_a_pattern(tree: Tree, grep: Grep) -> None:
    """A leading '-' is searched for, not taken as an option."""
    (tree.data / "a.txt").write_text("--flag\n")
    assert grep(pattern="--flag") == ("a.txt:1:--flag", False)


def test_rg_and_grep_give_the_same_output(tree: Tree) -> None:
    """Over a mixed tree, ripgrep and the fallback print exactly the same lines."""
    for n in range(60):
        sub = tree.data / f"d{n % 7}" / ("x-y" if n % 2 else "x")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{n}.txt").write_text("".join(f"row {i} value={n * i}\n" for i in range(5)))
    outputs = []
    for engine in ("rg", "grep"):
        argv, _ = grep_request(
            {"pattern": r"value=[0-9]*7\b", "max_results": 1000},
            workdir=str(tree.data),
            visible_roots=[str(tree.data)],
            engine=engine,
        )
        outputs.append(grep_text(*_run(argv, tree.data)))
    assert outputs[0] == outputs[1]
    assert outputs[0][0].count("\n") > 10


def test_auto_uses_ripgrep_when_present(tree: Tree) -> None:
    """The default engine is rg when the sandbox has it: a ripgrep-only escape works."""
    (tree.data / "a.txt").write_text("id 42\n")
    argv, _ = grep_request(
        {"pattern": r"\d+"}, workdir=str(tree.data), visible_roots=[str(tree.data)]
    )
    assert grep_text(*_run(argv, tree.data)) == ("a.txt:1:id 42", False)


def test_grep_text_rules() -> None:
    """Exit 0 is matches, 1 with no output is no match, anything else an error."""
    assert grep_text("./a:1:x\n", 0) == ("a:1:x", False)
    assert grep_text("", 1) == ("No matches found.", False)
    assert grep_text("boom\n", 2) == ("boom", True)
    assert grep_text("", None) == ("grep failed with exit code None.", True)


def test_bash_runs_sh_c_in_the_workdir() -> None:
    """bash is /bin/sh -c with the command as one argument and nothing on stdin."""
    assert bash_request({"command": "echo $HOME; ls"}) == (["/bin/sh", "-c", "echo $HOME; ls"], b"")


def bash_text(output: str, exit_code: int | None, *, timed_out: bool) -> str:
    return render_command(
        RunOutcome(output=output, exit_code=exit_code, timed_out=timed_out),
        timeout=5,
        show_exit_code=True,
    ).text


def test_bash_output_is_followed_by_the_exit_code() -> None:
    """The combined output is followed by [exit code N], even when it is zero or empty."""
    assert bash_text("hi\n", 0, timed_out=False) == "hi\n[exit code 0]"
    assert bash_text("oops", 3, timed_out=False) == "oops\n[exit code 3]"
    assert bash_text("", 0, timed_out=False) == "[exit code 0]"


def test_bash_timeout_ends_with_the_timeout_note() -> None:
    """A timed-out call has no exit code line; it ends with the timeout note instead."""
    assert bash_text("partial", None, timed_out=True) == "partial\n[timed out after 5 s]"


def test_bash_argv_really_runs_the_command(tree: Tree) -> None:
    """The argv runs the command through a real shell and reports its exit status."""
    argv, _ = bash_request({"command": "echo out; echo err >&2; exit 4"})
    output, code = _run(argv, tree.data)
    assert code == 4
    assert bash_text(output, code, timed_out=False) == "out\nerr\n[exit code 4]"
