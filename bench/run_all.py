"""Run every benchmark script in ``bench/`` with short defaults, one after
another, and print their tables.

Usage: python bench/run_all.py [--full] [--only NAME ...] [--list]

Scripts are the ``bench/*.py`` files other than this one, the helpers
(names starting with ``_``) and ``before_after.py`` (it compares two
revisions of the code rather than measuring against a peer, and is run on
its own), in name order. Each gets its short-run
option, found in its ``--help``: ``--quick`` when it has one, otherwise
``--seconds 0.2`` when it has that, otherwise no arguments. ``--full``
passes no options (each script's full defaults). Scripts run one at a time
so that they do not compete for the CPU; the exit status is the number of
scripts that failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    return sorted(p for p in HERE.glob("*.py")
                  if not p.name.startswith("_")
                  and p.name not in (Path(__file__).name, "before_after.py"))


def short_options(script: Path) -> list[str]:
    """The option that makes ``script`` run briefly (see the docstring)."""
    text = subprocess.run([sys.executable, str(script), "--help"],
                          capture_output=True, text=True).stdout
    if "--quick" in text:
        return ["--quick"]
    if "--seconds" in text:
        return ["--seconds", "0.2"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true",
                        help="run each script with its full defaults")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="only this script (file name with or without "
                             ".py; repeatable)")
    parser.add_argument("--list", action="store_true", help="list the scripts")
    args = parser.parse_args()
    found = scripts()
    if args.only:
        wanted = {n.removesuffix(".py") for n in args.only}
        unknown = wanted - {p.stem for p in found}
        if unknown:
            parser.error(f"no such script: {', '.join(sorted(unknown))} "
                         f"(have {', '.join(p.stem for p in found)})")
        found = [p for p in found if p.stem in wanted]
    if args.list:
        print("\n".join(p.name for p in found))
        return 0
    failed = 0
    for script in found:
        options = [] if args.full else short_options(script)
        command = ["python", f"bench/{script.name}", *options]
        print(f"==> {' '.join(command)}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(script), *options])
        took = time.perf_counter() - start
        if proc.returncode:
            failed += 1
            print(f"==> {script.name} failed (exit status {proc.returncode})")
        print(f"==> {script.name}: {took:.1f} s\n", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
