"""``flowzoo perf-compare BASELINE.json NEW.json``: fail on a regression of the ours / reference ratio.

Both files are pytest-benchmark JSON written by ``tests/test_bench_perf.py`` (``--benchmark-json``); each benchmark's
``extra_info.ratio`` is the median over interleaved pairs of ours / reference seconds. A ratio more than ``--tolerance``
(default 15%) above the baseline's is a regression (exit 1). Ratios, not absolute times: the machines are noisy and
differ, while both variants of a pair see the same machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flowzoo.command_line import run_alias
from flowzoo.errors import ConfigError


def ratios(path: str | Path) -> dict[str, float]:
    try:
        data = json.loads(Path(path).read_text())
        return {b["name"]: float(b["extra_info"]["ratio"]) for b in data["benchmarks"] if "ratio" in b["extra_info"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"perf_compare: {str(path)!r} is not a pytest-benchmark JSON of tests/test_bench_perf.py: "
                          f"{type(error).__name__}: {error}") from None


def compare(baseline: dict[str, float], new: dict[str, float], tolerance: float = 0.15) -> tuple[list[str], bool]:
    """Report lines and whether every benchmark of the baseline is present in ``new`` and within the tolerance."""
    lines, ok = [], True
    for name, base in sorted(baseline.items()):
        if name not in new:
            lines.append(f"{name}: missing from the new run (baseline ratio {base:.3f})")
            ok = False
            continue
        change = new[name] / base - 1
        bad = change > tolerance
        ok &= not bad
        lines.append(f"{name}: ratio {new[name]:.3f} vs baseline {base:.3f} ({change:+.1%})"
                     + ("  REGRESSION" if bad else ""))
    return lines, ok


DESCRIPTION = ("Both files are pytest-benchmark JSON (tests/test_bench_perf.py, --benchmark-json); a ratio more "
               "than\n--tolerance above the baseline's, or a benchmark missing, is a regression (exit 1).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo perf-compare``'s arguments."""
    parser.add_argument("baseline", help="the baseline's JSON (e.g. benchmark/perf/baseline.json)")
    parser.add_argument("new", help="the new measurement's JSON")
    parser.add_argument("--tolerance", type=float, default=0.15, help="allowed relative rise of a ratio")


def run(args: argparse.Namespace) -> int:
    """``flowzoo perf-compare``: one line per benchmark; exit 1 on a regression."""
    if not args.tolerance >= 0:
        args.command_parser.error(f"--tolerance {args.tolerance} must be >= 0")
    lines, ok = compare(ratios(args.baseline), ratios(args.new), args.tolerance)
    print("\n".join(lines))
    if not ok:
        print(f"perf: the ours/reference ratio regressed by more than {args.tolerance:.0%} (or a benchmark is "
              "missing)", file=sys.stderr)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m flowzoo.benchmark.perf.compare``: the older spelling of ``flowzoo perf-compare``."""
    return run_alias("flowzoo.benchmark.perf.compare", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
