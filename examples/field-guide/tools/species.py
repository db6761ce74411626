"""Print the field guide's species pages as JSON, optionally only those of one habitat.

Reads the call's arguments as one JSON object on stdin; runs with the workdir
(the sample data) as its current directory.
"""

import json
import pathlib
import sys


def front_matter(text):
    """Return the key: value pairs between the page's opening '---' lines."""
    _, head, _ = text.split("---", 2)
    pairs = (line.split(":", 1) for line in head.strip().splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def main():
    request = json.load(sys.stdin)
    wanted = str(request.get("habitat") or "").strip().lower()
    rows = []
    for page in sorted(pathlib.Path("species").glob("*.md")):
        fields = front_matter(page.read_text(encoding="utf-8"))
        habitats = [
            h.strip().lower() for h in fields["habitat"].strip("[]").split(",") if h.strip()
        ]
        if wanted and wanted not in habitats:
            continue
        rows.append(
            {
                "page": page.name,
                "name": fields["name"],
                "family": fields["family"],
                "habitat": habitats,
                "length_cm": int(fields["length_cm"]),
            }
        )
    json.dump(rows, sys.stdout, indent=1)
    print()


main()
