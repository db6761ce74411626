"""Benchmark the built-ins against the raw tools they stand in for, as ratios from one run.

- grep (the built-in's argv, rg engine, sorted and capped) against raw ``rg`` over
  a generated tree of 50,000 files;
- glob (the file tool) against ``rg --files -g``;
- read of the last lines of a 1 GB file against ``tail -n +K | head`` (the same
  scan from the start) and ``tail -n 400`` (a seek from the end);

and the host's peak memory (this process and its children). Everything lives in
a temporary folder removed at the end. Run: ``python bench/bench_builtins.py``.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from astralvessel.builtins import grep_request
from astralvessel.results import grep_text
from astralvessel.sandbox.server._files import FileContext, handle

FILES = 50_000
PER_DIR = 100
BIG_BYTES = 1 << 30
READ_LIMIT = 400


def best_of(runs: int, work: Callable[[], object]) -> float:
    """The fastest of ``runs`` timings of ``work`` (warm caches, least noise)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def make_tree(root: Path) -> None:
    """FILES small text files, PER_DIR to a folder; one in 50 is a .py file."""
    for n in range(FILES):
        folder = root / f"d{n // PER_DIR:04}"
        if n % PER_DIR == 0:
            folder.mkdir()
        suffix = ".py" if n % 50 == 0 else ".txt"
        body = "".join(f"line {i} of file {n}: value={n * i}\n" for i in range(20))
        if n % 500 == 0:
            body += "needle here\n"
        (folder / f"f{n:05}{suffix}").write_text(body)


def make_big(path: Path) -> int:
    """A 1 GB text file of numbered lines written in large blocks; returns its line count."""
    line = b"%010d " + b"x" * 68 + b"\n"
    per_block = (1 << 20) // len(line)
    lines = 0
    with path.open("wb") as f:
        while f.tell() < BIG_BYTES:
            f.write(b"".join(line % (lines + i) for i in range(per_block)))
            lines += per_block
    return lines


def row(name: str, ours: float, baseline: str, raw: float) -> None:
    """Print one comparison: our time, the baseline's, and their ratio."""
    print(
        f"{name:6} {ours * 1000:8.1f} ms   {baseline:12} {raw * 1000:8.1f} ms"
        f"   ratio {ours / raw:7.2f}"
    )


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    return done.stdout.decode("utf-8", "replace")


def main() -> None:
    if not shutil.which("rg"):
        raise SystemExit("ripgrep (rg) is needed for the baselines")
    base = Path(tempfile.mkdtemp(prefix="av-bench-"))
    try:
        tree = base / "tree"
        tree.mkdir()
        started = time.perf_counter()
        make_tree(tree)
        print(f"generated {FILES} files in {time.perf_counter() - started:.1f} s")
        ctx = FileContext(str(tree), [str(tree)], deadline=None, timeout=None)

        argv, _ = grep_request(
            {"pattern": "needle", "max_results": 1000}, workdir=str(tree), visible_roots=[str(tree)]
        )
        ours = best_of(3, lambda: grep_text(run(argv, tree), 0))
        raw = best_of(3, lambda: run(["rg", "needle"], tree))
        row("grep", ours, "rg", raw)

        def our_glob() -> str:
            return handle("glob", {"pattern": "*.py", "max_results": 2000}, ctx)[0]

        raw_glob = ["rg", "--files", "-g", "*.py"]
        assert len(our_glob().splitlines()) == len(run(raw_glob, tree).splitlines())
        ours = best_of(3, our_glob)
        raw = best_of(3, lambda: run(raw_glob, tree))
        row("glob", ours, "rg --files", raw)

        shutil.rmtree(tree)
        big = base / "big.txt"
        started = time.perf_counter()
        lines = make_big(big)
        took = time.perf_counter() - started
        print(f"wrote {big.stat().st_size >> 20} MiB ({lines} lines) in {took:.1f} s")
        offset = lines - READ_LIMIT + 1
        big_ctx = FileContext(str(base), [str(base)])

        def our_read() -> str:
            text, is_error = handle(
                "read", {"path": "big.txt", "offset": offset, "limit": READ_LIMIT}, big_ctx
            )
            assert not is_error
            return text

        scan = ["sh", "-c", f"tail -n +{offset} big.txt | head -n {READ_LIMIT}"]
        assert len(our_read().splitlines()) == len(run(scan, base).splitlines()) == READ_LIMIT
        ours = best_of(3, our_read)
        raw_scan = best_of(3, lambda: run(scan, base))
        raw_seek = best_of(3, lambda: run(["tail", "-n", str(READ_LIMIT), "big.txt"], base))
        row("read", ours, "tail -n +K", raw_scan)
        row("read", ours, "tail -n 400", raw_seek)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak memory: this process {own:.0f} MiB, largest child {children:.0f} MiB")


if __name__ == "__main__":
    main()
