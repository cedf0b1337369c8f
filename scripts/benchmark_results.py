"""benchmarks/RESULTS.md and the pages' figure blocks from the benchmark JSON: write them, or check them.

--write regenerates benchmarks/RESULTS.md from the `meta` and `headline` blocks of benchmarks/*.json (the
archive left out), and the body of every `<!-- results: VIEW ... -->` ... `<!-- /results -->` block of README.md
and docs/*.md. --check exits 1, one line per problem, when a JSON (archive included) misses the schema, naming the
file and the field, when RESULTS.md or a block differs from what --write would write (naming the page, the line
and the block), or when a marker names an unknown view or argument. The schema and RESULTS.md are in
tritontts/bench/results.py, the views in tritontts/bench/results_views.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritontts.bench import results

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="regenerate RESULTS.md")
    action.add_argument(
        "--check", action="store_true", help="exit 1 when RESULTS.md, a page's block or a JSON is wrong"
    )
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=REPO / "benchmarks",
        help="the folder of the JSON (default: %(default)s)",
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="RESULTS.md's path (default: BENCHMARKS/RESULTS.md)"
    )
    parser.add_argument(
        "--pages",
        type=Path,
        nargs="*",
        default=None,
        help="markdown pages with generated blocks (default: README.md and docs/*.md beside BENCHMARKS)",
    )
    args = parser.parse_args(argv)
    if args.write:
        problems = results.write(args.benchmarks, args.results, args.pages)
        if not problems:
            print(
                f"wrote {args.results or args.benchmarks / results.RESULTS_NAME} and the pages' figure blocks"
            )
    else:
        problems = results.check(args.benchmarks, args.results, args.pages)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"benchmark results: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
