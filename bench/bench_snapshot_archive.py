"""Benchmark: a snapshot's saved form written and loaded, against ``tar -c`` and ``tar -x``.

A tree of 100 MiB in 10 000 files (100 folders of 100 files, sizes spread
around 10 KiB, random bytes) is generated once; then, as medians over a few
runs in this same process, on the same disk, the page cache warm for both:

- ``tar -c``: GNU tar writes the tree to an archive file (the baseline for saving);
- ``scan_tree`` and ``write_archive``: the manifest (every file hashed), then
  the saved form written to a file; their sum against ``tar -c``;
- ``tar -x``: GNU tar unpacks its own archive of the tree (the baseline for restoring);
- ``cp -a``: the tree copied as it is (what a restore that copies costs at best);
- ``extract_archive``: the saved form checked whole (every header, every
  file's digest) and then written, against ``tar -x``. Target: at most 0.5x.

Run: ``python bench/bench_snapshot_archive.py [--runs N] [--mib M] [--files N] [--dir D]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from astralvessel._executor._snapshot._archive import extract_archive, write_archive
from astralvessel._executor._snapshot._tree import scan_tree

#: The issue's target: restoring a saved snapshot takes at most half of ``tar -x``.
RESTORE_TARGET = 0.5
FOLDERS = 100


def make_tree(root: Path, total: int, files: int) -> None:
    """Write ``files`` files of ``total`` bytes in all, sizes spread from 0 to twice the mean."""
    rng = random.Random(30)  # noqa: S311 - reproducible filler bytes, not secrets
    mean = total // files
    sizes = [rng.randrange(0, 2 * mean + 1) for _ in range(files)]
    sizes[-1] += total - sum(sizes)
    for index, size in enumerate(sizes):
        folder = root / f"d{index % FOLDERS:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:05d}.bin").write_bytes(rng.randbytes(max(size, 0)))


def _median(action: Callable[[], object], runs: int, reset: Callable[[], object]) -> float:
    samples = []
    for _ in range(runs):
        reset()
        began = time.perf_counter()
        action()
        samples.append(time.perf_counter() - began)
    reset()
    return statistics.median(samples)


def bench(work: Path, runs: int, total: int, files: int) -> None:
    """Measure saving and loading one generated tree and print the figures and ratios."""
    tree = work / "tree"
    make_tree(tree, total, files)
    bounds = {"max_bytes": 2 * total, "max_files": 2 * files + FOLDERS}
    tar_file, saved, out = work / "plain.tar", work / "saved.tar", work / "out"

    def clear() -> None:
        shutil.rmtree(out, ignore_errors=True)

    def tar_c() -> None:
        subprocess.run(["tar", "-cf", str(tar_file), "-C", str(tree), "."], check=True)

    def tar_x() -> None:
        out.mkdir()
        subprocess.run(["tar", "-xf", str(tar_file), "-C", str(out)], check=True)

    def cp_a() -> None:
        subprocess.run(["cp", "-a", str(tree), str(out)], check=True)

    def write() -> None:
        with saved.open("wb") as sink:
            write_archive(tree, manifest, sink)

    def extract() -> None:
        with saved.open("rb") as source:
            extract_archive(source, out, **bounds)

    tar_c_time = _median(tar_c, runs, clear)
    scan_time = _median(lambda: scan_tree(tree, **bounds), runs, clear)
    manifest = scan_tree(tree, **bounds)
    write_time = _median(write, runs, clear)
    tar_x_time = _median(tar_x, runs, clear)
    cp_time = _median(cp_a, runs, clear)
    extract_time = _median(extract, runs, clear)
    save_time = scan_time + write_time
    ratio = extract_time / tar_x_time
    print(f"{total / (1 << 20):.0f} MiB in {files} files, {FOLDERS} folders, under {work}")
    print(f"  tar -c                  {tar_c_time * 1000:8.1f} ms")
    print(f"  scan_tree               {scan_time * 1000:8.1f} ms")
    print(f"  write_archive           {write_time * 1000:8.1f} ms")
    save_ratio = save_time / tar_c_time
    print(f"  scan + write            {save_time * 1000:8.1f} ms   {save_ratio:5.2f}x tar -c")
    print(f"  tar -x                  {tar_x_time * 1000:8.1f} ms")
    print(f"  cp -a                   {cp_time * 1000:8.1f} ms")
    verdict = "meets" if ratio <= RESTORE_TARGET else "misses"
    print(
        f"  extract_archive         {extract_time * 1000:8.1f} ms   {ratio:5.2f}x tar -x "
        f"(target at most {RESTORE_TARGET}x: {verdict}), {extract_time / cp_time:5.2f}x cp -a"
    )


def main() -> None:
    """Parse arguments, run in a temporary folder, and remove it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None, help="where the trees go (a disk)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-snapshot-") as work:
        bench(Path(work), args.runs, args.mib << 20, args.files)


if __name__ == "__main__":
    main()
