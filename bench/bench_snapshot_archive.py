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

With ``--docker-frozen``, run as an ordinary user in the ``docker`` group, the same
tree is written in a Docker turn instead, frozen by its ``fork(2)``, and the frozen
layer's snapshot saved (``TurnSnapshot.save``: its files streamed by the backend's
reader container, the host checking each digest), against ``tar -c`` of the same
files in the turn (``docker exec``, piped to ``cat``: GNU tar skips reading files
written to ``/dev/null``). ``ASTRALVESSEL_DOCKER_IMAGE`` names the image.

Run: ``python bench/bench_snapshot_archive.py [--runs N] [--mib M] [--files N] [--dir D]
[--docker-frozen]``.
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


#: The turn's program writing ``make_tree``'s tree into its workspace (argv: bytes, files).
_MAKE_IN_TURN = """
import random, sys
from pathlib import Path
total, files = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(30)
mean = total // files
sizes = [rng.randrange(0, 2 * mean + 1) for _ in range(files)]
sizes[-1] += total - sum(sizes)
for index, size in enumerate(sizes):
    folder = Path("/workspace/tree/d%03d" % (index % 100))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("f%05d.bin" % index)).write_bytes(rng.randbytes(max(size, 0)))
"""


def bench_docker_frozen(work: Path, runs: int, total: int, files: int) -> None:
    """Save a Docker turn's frozen layer of the tree, against ``tar -c`` in the turn."""
    import os

    from astralvessel import Executor, Registry
    from astralvessel.sandbox import Limits
    from astralvessel.sandbox.docker import Docker

    image = os.environ.get("ASTRALVESSEL_DOCKER_IMAGE", "astralvessel-test/base:bookworm")
    limits = Limits(disk_mb=4 * (total >> 20) + 256, memory_mb=2048)
    backend = Docker(base_image=image, pull=False)
    with Executor(Registry(), sandbox=backend, limits=limits) as executor, executor.turn() as turn:
        made = turn.exec(["python3", "-c", _MAKE_IN_TURN, str(total), str(files)], timeout=600)
        if made.returncode:
            raise SystemExit(made.stderr.decode(errors="replace"))
        forks = turn.fork(2)
        try:
            snapshot = forks[0].snapshot()
            held = "held layer" if snapshot.held_layer is not None else "not a held layer"
            saved = work / "frozen.snapshot"

            def save() -> None:
                with saved.open("wb") as sink:
                    snapshot.save(sink)

            def tar_c() -> None:
                script = "tar -cf - -C /workspace tree | cat > /dev/null"
                done = turn.exec(["/bin/sh", "-c", script], timeout=600)
                if done.returncode:
                    raise SystemExit(done.stderr.decode(errors="replace"))

            tar_time = _median(tar_c, runs, lambda: None)
            save_time = _median(save, runs, lambda: None)
        finally:
            for fork in forks:
                fork.close()
    print(f"{total / (1 << 20):.0f} MiB in {files} files, a Docker turn's frozen layer ({held})")
    print(f"  tar -c in the turn      {tar_time * 1000:8.1f} ms")
    ratio = save_time / tar_time
    print(f"  TurnSnapshot.save       {save_time * 1000:8.1f} ms   {ratio:5.2f}x tar -c")


def main() -> None:
    """Parse arguments, run in a temporary folder, and remove it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=None, help="where the trees go (a disk)")
    parser.add_argument(
        "--docker-frozen", action="store_true", help="save a Docker turn's frozen layer instead"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-snapshot-") as work:
        run = bench_docker_frozen if args.docker_frozen else bench
        run(Path(work), args.runs, args.mib << 20, args.files)


if __name__ == "__main__":
    main()
