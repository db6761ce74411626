"""The pool tool: reads {"name": ...} on stdin, prints that pool's page from /data."""

import json
import sys
from pathlib import Path

name = json.load(sys.stdin)["name"]
page = Path("/data") / f"{name}.txt"
if not page.is_file():
    print(
        f"There is no pool called {name!r}; the pools are: "
        + ", ".join(sorted(p.stem for p in Path("/data").glob("*.txt")))
    )
    sys.exit(1)
print(page.read_text(), end="")
