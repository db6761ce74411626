"""HTML-to-text throughput on a 4 MB page: astralvessel's converter against html2text.

Both run in this process on the same page; the script prints each one's
throughput and the ratio (above 1 means astralvessel is faster).
Run: python bench/bench_html.py [--repeat N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import html2text

from astralvessel.web import html_to_text

TARGET_BYTES = 4 * 1024 * 1024


def make_page(size: int = TARGET_BYTES, seed: int = 7) -> str:
    """Build a realistic article page of about ``size`` bytes: text, links, lists, tables, code."""
    rng = random.Random(seed)  # noqa: S311 - reproducible filler text, not secrets
    words = [
        *("otter", "river", "fish", "stream", "holt", "spraint", "whiskers", "coast"),
        *("kelp", "crab", "eel", "dusk", "territory", "cub", "swim", "dive", "fur"),
        *("den", "bank", "reed", "willow", "current", "estuary"),
    ]

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(6, 18))).capitalize() + "."

    parts = [
        "<!doctype html><html><head><title>Field guide</title>",
        "<style>body{font:14px sans-serif}.nav{display:flex}</style>",
        "<script>window.analytics = {track: function(){}};</script></head><body>",
        '<nav class="nav"><a href="/">Home</a> <a href="/otters">Otters</a></nav>',
    ]
    size_so_far = sum(map(len, parts))
    section = 0
    while size_so_far < size:
        section += 1
        block = [f"<h2>Section {section}</h2>"]
        for _ in range(4):
            block.append(
                f"<p>{sentence()} <a href='/notes/{section}'>{rng.choice(words)}</a> "
                f"<em>{rng.choice(words)}</em> {sentence()}</p>"
            )
        block.append("<ul>" + "".join(f"<li>{sentence()}</li>" for _ in range(5)) + "</ul>")
        block.append(
            "<table><tr><th>Name</th><th>Count</th></tr>"
            + "".join(
                f"<tr><td>{rng.choice(words)}</td><td>{rng.randint(1, 99)}</td></tr>"
                for _ in range(4)
            )
            + "</table>"
        )
        block.append(f"<pre><code>count = {section}\nprint(count)</code></pre>")
        block.append("<div hidden>tracking pixel text</div><script>track()</script>")
        chunk = "\n".join(block)
        parts.append(chunk)
        size_so_far += len(chunk)
    parts.append("</body></html>")
    return "".join(parts)


def best_time(function: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def baseline(page: str) -> str:
    """html2text with settings close to ours (no wrapping, links kept)."""
    converter = html2text.HTML2Text()
    converter.body_width = 0
    return str(converter.handle(page))


def main() -> None:
    """Run both converters and print throughputs and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    page = make_page()
    megabytes = len(page.encode()) / (1024 * 1024)
    ours = best_time(lambda: html_to_text(page, "https://guide.example/"), args.repeat)
    theirs = best_time(lambda: baseline(page), args.repeat)
    print(f"page: {megabytes:.2f} MB of HTML")
    print(f"astralvessel html_to_text: {ours:.3f} s  ({megabytes / ours:.2f} MB/s)")
    print(f"html2text (baseline):      {theirs:.3f} s  ({megabytes / theirs:.2f} MB/s)")
    print(f"ratio (astralvessel speed / html2text speed): {theirs / ours:.2f}")


if __name__ == "__main__":
    main()
