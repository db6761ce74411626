"""Count the words of one file; called as ``word_count.py --path=species/otter.md``."""

import argparse
import pathlib

parser = argparse.ArgumentParser()
parser.add_argument("--path", required=True)
path = pathlib.Path(parser.parse_args().path)
print(f"{path}: {len(path.read_text(encoding='utf-8').split())} words")
