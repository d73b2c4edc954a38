"""Plots of the recorded benchmark figures, for the documentation.

Reads the tables of ``docs/benchmarks.md`` (the figures the scripts of this
folder printed, as recorded there) and writes PNGs into
``docs/img/bench/``, which the page shows:

* ``emulated_vs_qemu.png``: our emulated engine against ``qemu-<arch>`` on
  the same freestanding kernels (``emulator_vs_qemu.py``), ratio of medians;
* ``native_vs_iree.png``: a native dispatch against IREE's
  ``iree-benchmark-executable`` over grid sizes (``grid_sweep.py``);
* ``per_call.png``: the cost of one call of each bundled sample, IREE,
  ours native and ours emulated per architecture (``dispatch.py``);
* ``cold_load.png``: loading a file against ``dlopen`` (``cold_load.py``).

Usage: ``python bench/plots.py [--out DIR]`` (needs matplotlib: the
``docs`` extra). Re-run it after recording new figures in the page.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "docs" / "img" / "bench"

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_TIME = re.compile(r"([0-9.]+)\s*(ns|us|µs|ms|s)\b")


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table after the line ``heading``, as rows of
    header -> cell text."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    header, body = rows[0], rows[2:]
    return [dict(zip(header, row)) for row in body]


def seconds(cell: str, which: int = 0) -> float:
    """Seconds of the ``which``-th time in a cell (``"29.5 / 39.5 ms"``: the
    unit after the last number applies to a bare number before a slash)."""
    cell = re.sub(r"([0-9.]+)\s*/\s*([0-9.]+)\s*(ns|us|µs|ms|s)\b", r"\1 \3 / \2 \3", cell)
    found = _TIME.findall(cell)
    value, unit = found[which]
    return float(value) * _UNITS[unit]


def emulated_vs_qemu(text: str, plt, out: Path) -> Path:
    rows = table_after(text, "### emulator_vs_qemu.py")
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    arches = list(dict.fromkeys(r["arch"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(arches)
    for i, arch in enumerate(arches):
        ratios = [float(next(r for r in rows if r["kernel"] == k and r["arch"] == arch)
                        ["ratio (median)"].rstrip("x")) for k in kernels]
        ax.bar([k + i * width for k in range(len(kernels))], ratios, width, label=arch)
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xticks([k + width * (len(arches) - 1) / 2 for k in range(len(kernels))], kernels)
    ax.set_ylabel("our time / qemu-user's (median)")
    ax.set_title("Emulated engine vs qemu-user on the same kernels (lower is better)")
    ax.legend(frameon=False)
    return _save(fig, out / "emulated_vs_qemu.png")


def native_vs_iree(text: str, plt, out: Path) -> Path:
    rows = table_after(text, "### grid_sweep.py")
    grid = [int(r["workgroups"]) for r in rows]
    iree = [seconds(r["IREE local-sync (min / median)"], 1) * 1e6 for r in rows]
    ours = [seconds(r["ours native `workers=1` (min / median)"], 1) * 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.loglog(grid, iree, "o-", label="IREE iree-benchmark-executable (local-sync)")
    ax.loglog(grid, ours, "s-", label="ours, native, workers=1")
    ax.set_xlabel("workgroups (row-sum kernel, x86_64)")
    ax.set_ylabel("time per dispatch (us, median)")
    ax.set_title("Native dispatch vs IREE over grid sizes")
    ax.legend(frameon=False)
    return _save(fig, out / "native_vs_iree.png")


def per_call(text: str, plt, out: Path) -> Path:
    rows = table_after(text, "### dispatch.py")
    series = {"IREE local-sync": "IREE local-sync (median)",
              "ours native": "ours native (median)",
              "ours emulated x86_64": "emulated x86_64",
              "ours emulated aarch64": "emulated aarch64",
              "ours emulated riscv64": "emulated riscv64"}
    kernels = [r["kernel"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / len(series)
    for i, (label, column) in enumerate(series.items()):
        ax.bar([k + i * width for k in range(len(kernels))],
               [seconds(r[column]) * 1e6 for r in rows], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks([k + width * (len(series) - 1) / 2 for k in range(len(kernels))], kernels)
    ax.set_ylabel("time per call (us, median, log)")
    ax.set_title("One dispatch of each bundled sample")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, out / "per_call.png")


def cold_load(text: str, plt, out: Path) -> Path:
    rows = table_after(text, "### cold_load.py")
    labels = [re.sub(r"`", "", r["load"]) for r in rows]
    medians = [seconds(r["median"]) * 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.barh(labels[::-1], medians[::-1])
    ax.set_xlabel("time to load (us, median)")
    ax.set_title("Loading a file vs dlopen")
    ax.tick_params(axis="y", labelsize=8)
    return _save(fig, out / "cold_load.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    args.out.mkdir(parents=True, exist_ok=True)
    text = PAGE.read_text()
    made = [plot(text, plt, args.out)
            for plot in (emulated_vs_qemu, native_vs_iree, per_call, cold_load)]
    for path in made:
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return made


if __name__ == "__main__":
    main()
