"""benchmarks/RESULTS.md and the proof record in tests/gpu/README.md, generated from the result files, so that no
figure in them can drift from its JSON.

The command line only: what the document says and how is in the resultsdoc package beside this script (its
sections as data in resultsdoc/sections.py, each topic's rows and prose in resultsdoc/topics/, the proof record in
resultsdoc/proofs.py). Every entry names its file, the file's git revision, host and command, taken from the file's
own fields; the figures are read from the JSON every time.

usage: python benchmarks/results_doc.py --write    (writes benchmarks/RESULTS.md and the tests/gpu/README.md section)
       python benchmarks/results_doc.py --check    (exit 1 with a diff when a committed file differs)
       [--results-dir DIR] [--doc PATH] [--proofs-readme PATH]"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from resultsdoc.document import render
from resultsdoc.paths import DOC, PROOFS_README, RESULTS_DIR
from resultsdoc.proofs import render_proofs, with_proofs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the document and the proofs section")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when a committed file differs")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--proofs-readme", type=Path, default=PROOFS_README)
    args = ap.parse_args(argv)
    readme = args.proofs_readme.read_text() if args.proofs_readme.is_file() else ""
    wanted = {args.doc: render(args.results_dir),
              args.proofs_readme: with_proofs(readme, render_proofs(args.results_dir))}
    if args.write:
        for path, text in wanted.items():
            path.write_text(text)
            print(path)
        return 0
    differs = 0
    for path, text in wanted.items():
        current = path.read_text() if path.is_file() else ""
        if current != text:
            differs = 1
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                       f"{path} (committed)", f"{path} (from the result files)"))
    if differs:
        print("\nout of date: python benchmarks/results_doc.py --write", file=sys.stderr)
    return differs


if __name__ == "__main__":
    sys.exit(main())
