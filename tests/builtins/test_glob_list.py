"""glob and list: patterns, order, limits, the timeout, and never descending through links."""

from __future__ import annotations

import os
import time

import pytest

from astralvessel.builtins import BUILTINS
from astralvessel.sandbox.server._files import (
    GLOB_MAX,
    GLOB_SCAN_ENTRIES,
    LIST_MAX_ENTRIES,
    LIST_SCAN_ENTRIES,
    UNDECODABLE_NOTE,
    handle,
)

from .conftest import CANARY, Call, Tree


@pytest.fixture
def docs(tree: Tree) -> Tree:
    """A small tree: notes at the top, in sub/, and in sub/deep/."""
    for rel in ("a.md", "b.txt", "sub/c.md", "sub/deep/d.md", "sub/deep/e.py", "a-b/f.md"):
        target = tree.data / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x\n")
    return tree


def test_glob_without_slash_searches_the_whole_tree(docs: Tree, call: Call) -> None:
    """A pattern with no '/' matches file names at any depth, in name order per directory."""
    assert call("glob", pattern="*.md") == ("a-b/f.md\na.md\nsub/c.md\nsub/deep/d.md", False)


def test_glob_with_slash_is_relative_to_path(docs: Tree, call: Call) -> None:
    """A pattern with '/' matches paths relative to the search directory."""
    assert call("glob", pattern="sub/*.md") == ("sub/c.md", False)


def test_glob_double_star_spans_directories(docs: Tree, call: Call) -> None:
    """'**' matches any number of directories, including none."""
    assert call("glob", pattern="sub/**/*.md") == ("sub/c.md\nsub/deep/d.md", False)


def test_glob_braces_classes_and_question_marks(docs: Tree, call: Call) -> None:
    """{a,b}, [abc] and ? work as in ripgrep's globs."""
    assert call("glob", pattern="*.{py,txt}") == ("b.txt\nsub/deep/e.py", False)
    assert call("glob", pattern="[ab].??") == ("a.md", False)


def test_glob_path_names_the_search_directory(docs: Tree, call: Call) -> None:
    """path sets where to search from, and results are shown under the path as given."""
    assert call("glob", pattern="*.md", path="sub") == ("sub/c.md\nsub/deep/d.md", False)
    absolute = str(docs.data / "sub" / "deep")
    assert call("glob", pattern="*", path=absolute) == (
        f"{absolute}/d.md\n{absolute}/e.py",
        False,
    )


@pytest.mark.parametrize("pattern", ["/etc/*", "../*", "sub/../../*", ".."])
def test_glob_refuses_absolute_patterns_and_dot_dot(docs: Tree, call: Call, pattern: str) -> None:
    """A pattern must be relative and free of '..'."""
    text, is_error = call("glob", pattern=pattern)
    assert is_error
    assert "path" in text


def test_glob_max_results_defaults_to_200(tree: Tree, call: Call) -> None:
    """Without max_results, 200 paths come back and a note says more matched."""
    for n in range(250):
        (tree.data / f"f{n:03}.txt").write_text("")
    lines = call("glob", pattern="*.txt")[0].splitlines()
    assert len(lines) == 201
    assert lines[199] == "f199.txt"
    assert lines[200].startswith("[more than 200 files match")


def test_glob_max_results_is_at_most_2000(tree: Tree, call: Call) -> None:
    """max_results above 2000 is refused, and the schema says so."""
    assert call("glob", pattern="*", max_results=2001)[1]
    assert not call("glob", pattern="*", max_results=2000)[1]
    assert BUILTINS["glob"].parameters["properties"]["max_results"]["maximum"] == 2000


def test_glob_stops_at_the_timeout_and_says_so(docs: Tree) -> None:
    """Once the tool timeout has passed, glob stops and names the timeout."""
    for n in range(200):
        (docs.data / f"g{n}.txt").write_text("")
    ctx = docs.context(deadline=time.monotonic() - 1, timeout=7)
    text, is_error = handle("find", {"pattern": "*"}, ctx)
    assert not is_error
    assert text.splitlines()[-1].startswith("[stopped after 7 s, the tool timeout")


def test_glob_stops_reading_a_folder_at_the_timeout(docs: Tree) -> None:
    """The timeout is looked at while a folder is read, not only once it is read and sorted
    whole: a search past its deadline in a folder of 200 entries matches none of them."""
    for n in range(200):
        os.mknod(docs.data / "sub" / f"g{n:03}.txt")
    ctx = docs.context(deadline=time.monotonic() - 1, timeout=7)
    text, is_error = handle("find", {"pattern": "*.txt", "path": "sub"}, ctx)
    assert not is_error
    assert text.splitlines() == [
        f"No files matched '*.txt' under {docs.data / 'sub'}.",
        "[stopped after 7 s, the tool timeout: the list above is incomplete; "
        "narrow the pattern or path]",
    ]


def test_glob_reads_a_crowded_folder_only_to_its_bound(docs: Tree, call: Call) -> None:
    """A folder past 10 000 entries is searched in the first 10 000 read; the note names it."""
    (docs.data / "big").mkdir()
    for n in range(GLOB_SCAN_ENTRIES + 50):
        os.mknod(docs.data / "big" / f"e{n:05}.txt")
    text, is_error = call("glob", pattern="*.md")
    assert not is_error
    assert text.splitlines() == [
        "a-b/f.md",
        "a.md",
        "sub/c.md",
        "sub/deep/d.md",
        f"[folder big holds more than {GLOB_SCAN_ENTRIES} entries and was searched only in the "
        f"first {GLOB_SCAN_ENTRIES} read, not to the end: matches in the rest are missing "
        "above; use bash (find) to search such a folder whole]",
    ]
    found, _ = call("glob", pattern="e*.txt", path="big", max_results=GLOB_MAX)
    *paths, more, crowded = found.splitlines()
    assert paths == sorted(paths)
    assert len(paths) == GLOB_MAX
    assert more.startswith(f"[more than {GLOB_MAX} files match")
    assert crowded.startswith("[folder big holds more than")


def test_glob_with_no_match_is_not_an_error(docs: Tree, call: Call) -> None:
    """No matching file is a plain answer, not an error."""
    assert call("glob", pattern="*.rs") == (f"No files match '*.rs' under {docs.data}.", False)


def test_glob_never_descends_through_a_link(docs: Tree, call: Call) -> None:
    """Links to directories, inside or outside the data, are not entered."""
    (docs.data / "inside").symlink_to(docs.data / "sub")
    (docs.data / "escape").symlink_to(docs.outside)
    text, _ = call("glob", pattern="**/*.md")
    assert CANARY not in text
    assert "escape/" not in text
    assert "inside/" not in text


def test_list_shows_directories_first_then_files(docs: Tree, call: Call) -> None:
    """Directories come first with a trailing '/', then files, each group in name order."""
    (docs.data / ".hidden").write_text("")
    assert call("list") == ("a-b/\nsub/\n.hidden\na.md\nb.txt", False)


def test_list_takes_a_path(docs: Tree, call: Call) -> None:
    """path names the directory to list, relative or absolute."""
    assert call("list", path="sub") == ("deep/\nc.md", False)
    assert call("list", path=str(docs.data / "sub")) == ("deep/\nc.md", False)


def test_list_shows_at_most_500_entries_and_says_so(tree: Tree, call: Call) -> None:
    """Past 500 entries the rest are counted, not shown."""
    for n in range(520):
        (tree.data / f"e{n:03}").write_text("")
    lines = call("list")[0].splitlines()
    assert len(lines) == 501
    assert lines[499] == "e499"
    assert lines[500].startswith("[20 more entries not shown")


def test_list_reads_a_crowded_folder_only_to_its_bound(tree: Tree, call: Call) -> None:
    """A folder past 10 000 entries is not read to the end; the note says the 500 shown are
    sorted from the first 10 000 read."""
    for n in range(LIST_SCAN_ENTRIES + 50):
        os.mknod(tree.data / f"e{n:05}")
    text, is_error = call("list")
    lines = text.splitlines()
    assert not is_error
    assert len(lines) == LIST_MAX_ENTRIES + 1
    assert lines[:-1] == sorted(lines[:-1])
    assert lines[-1].startswith(f"[this folder holds more than {LIST_SCAN_ENTRIES} entries")


def test_list_stops_at_the_deadline_and_says_so(tree: Tree) -> None:
    """A listing still reading when the tool timeout passes shows what it read and says so."""
    for n in range(200):
        os.mknod(tree.data / f"e{n:03}")
    ctx = tree.context(deadline=time.monotonic() - 1, timeout=7)
    text, is_error = handle("entries", {}, ctx)
    lines = text.splitlines()
    assert not is_error
    assert 0 < len(lines) - 1 < 200
    assert lines[-1].startswith("[stopped after 7 s, the tool timeout, before the folder")


def test_list_of_an_empty_directory_says_so(tree: Tree, call: Call) -> None:
    """An empty directory is not an error, and the model is told it is empty."""
    assert call("list") == (f"[{tree.data} is empty]", False)


def test_list_of_a_file_is_an_error(docs: Tree, call: Call) -> None:
    """Listing a file points the model to read."""
    text, is_error = call("list", path="a.md")
    assert is_error
    assert "use read" in text


def test_list_shows_links_by_where_they_lead(docs: Tree, call: Call) -> None:
    """A link to a directory within the data is listed as one; a link outside is a plain entry."""
    (docs.data / "inside").symlink_to("sub")
    (docs.data / "escape").symlink_to(docs.outside)
    text, _ = call("list")
    assert "inside/" in text.splitlines()
    assert "escape" in text.splitlines()


def test_list_names_are_shown_even_when_not_utf8(tree: Tree, call: Call) -> None:
    """A file name that is not UTF-8 is shown with replacement characters, and a note says
    how to reach it (a tool's arguments cannot name its bytes)."""
    os.close(os.open(os.fsencode(tree.data) + b"/caf\xe9", os.O_CREAT | os.O_WRONLY, 0o644))
    os.close(os.open(os.fsencode(tree.data) + b"/plain", os.O_CREAT | os.O_WRONLY, 0o644))
    assert call("list") == (f"caf\ufffd\nplain\n{UNDECODABLE_NOTE}", False)
    os.unlink(os.fsencode(tree.data) + b"/caf\xe9")
    assert call("list") == ("plain", False)
