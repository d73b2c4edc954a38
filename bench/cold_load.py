"""Cold load of a bundled sample executable, against dlopen.

Usage: python bench/cold_load.py [--quick] [--rounds R] [--kernel K]

Ours, on ``hal_cpu/samples/<kernel>_<arch>.so``:

* ``hal_cpu.Executable(path)`` natively (host architecture) and emulated
  (x86_64, aarch64, riscv64): ELF checks, mapping, relocation, protections,
  then the library query and the export tables;
* ``elfloader.load(path)`` alone, natively and emulated (x86_64 when that is
  the host).

The emulated figures include starting a new unicorn CPU, as every
``Executable`` with its own backend does.

The peer is ``ctypes.CDLL`` (dlopen, RTLD_NOW) of a host shared library:
IREE's embedded ELFs are not loadable by dlopen in general, so the peer
loads a library built here with ``cc -shared`` from a trivial C file,
padded to at least the sample's size, and also ``sample_plugins/prebuilt/
system_plugin_<host>.so``, a real host library (it needs libc, already
loaded in this process). dlopen'd copies are closed with ``dlclose``.

"Cold" means a file this process has not loaded before: every round copies
each file to a new temporary path first (not timed), so the dynamic loader
cannot hand back an already loaded object. The modules are imported and the
file is in the page cache, so no first-import or disk time is in any
figure. Each round times every case once, in an order rotated by one per
round; the table gives min and median, and the ratio to dlopen of the
trivial library.
"""

from __future__ import annotations

import _ctypes
import argparse
import ctypes
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _timing as T

import elfloader
import fatelf.arches as A
from hal_cpu import Executable

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
PLUGINS = ROOT / "sample_plugins" / "prebuilt"
EMULATED = ("x86_64", "aarch64", "riscv64")

TRIVIAL_C = """\
#ifndef PAD
#define PAD 1
#endif
const unsigned char trivial_pad[PAD] = {1};
int trivial_add(int a, int b) { return a + b + trivial_pad[a & 0]; }
"""


def build_trivial(out: Path, size: int, host: str) -> Path:
    """A host shared library from a trivial C file, about ``size`` bytes."""
    src = out / "trivial.c"
    src.write_text(TRIVIAL_C)
    if shutil.which("cc"):
        cc = ["cc"]
    else:
        cc = [sys.executable, "-m", "ziglang", "cc", "-target", f"{host}-linux-gnu"]

    def compile_(pad: int) -> Path:
        lib = out / "trivial.so"
        subprocess.run([*cc, "-shared", "-fPIC", "-O2", "-g0", f"-DPAD={pad}",
                        "-Wl,-z,noseparate-code", str(src), "-o", str(lib)],
                       check=True, capture_output=True)
        return lib

    pad = 1
    for _ in range(8):  # file size grows with the pad, less page slack
        got = compile_(pad).stat().st_size
        if got >= size:
            break
        pad += size - got
    return out / "trivial.so"


class Fresh:
    """Copies ``path`` to a new file name on every :meth:`next` call."""

    _serial = itertools.count()

    def __init__(self, path: Path, tmp: Path):
        self.path, self.tmp = Path(path), tmp
        self.current: Path | None = None

    def next(self) -> Path:
        self.done()
        self.current = self.tmp / f"{next(self._serial)}_{self.path.name}"
        shutil.copyfile(self.path, self.current)
        return self.current

    def done(self) -> None:
        if self.current is not None:
            self.current.unlink(missing_ok=True)
            self.current = None


def case(path: Path, tmp: Path, load, unload):
    """Measurement: copy (untimed), ``load(copy)`` (timed), ``unload``."""
    fresh = Fresh(path, tmp)

    def measure() -> float:
        target = str(fresh.next())
        start = time.perf_counter()
        obj = load(target)
        elapsed = time.perf_counter() - start
        unload(obj)
        fresh.done()
        return elapsed
    return measure


def dlopen(path):
    return ctypes.CDLL(path)


def dlclose(lib) -> None:
    _ctypes.dlclose(lib._handle)


def elf_unload(module) -> None:
    module.close()
    module.backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=30, quick_rounds=8)
    parser.add_argument("--kernel", default="matmul",
                        choices=("matmul", "mul_add", "sum_last"))
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    info = A.host()
    host = info.name if info is not None and info.runtime else None

    tmp = Path(tempfile.mkdtemp(prefix="bench_cold_load_"))
    try:
        sample = SAMPLES / f"{args.kernel}_{host or 'x86_64'}.so"
        sizes = {}
        cases: dict[str, T.Measure] = {}
        peer = None
        if host is not None:
            trivial = build_trivial(tmp, sample.stat().st_size, host)
            peer = "dlopen trivial cc -shared library"
            sizes[peer] = trivial.stat().st_size
            cases[peer] = case(trivial, tmp, dlopen, dlclose)
            plugin = PLUGINS / f"system_plugin_{host}.so"
            if plugin.exists():
                name = f"dlopen {plugin.relative_to(ROOT)}"
                sizes[name] = plugin.stat().st_size
                cases[name] = case(plugin, tmp, dlopen, dlclose)
            name = f"elfloader.load native {sample.name}"
            sizes[name] = sample.stat().st_size
            cases[name] = case(sample, tmp, lambda p: elfloader.load(
                p, backend="native"), elf_unload)
        name = f"elfloader.load emulated {sample.name}"
        sizes[name] = sample.stat().st_size
        cases[name] = case(sample, tmp, lambda p: elfloader.load(
            p, backend="emulated"), elf_unload)
        if host is not None:
            name = f"Executable native {sample.name}"
            sizes[name] = sample.stat().st_size
            cases[name] = case(sample, tmp, lambda p: Executable(
                p, backend="native"), Executable.close)
        for arch in EMULATED:
            path = SAMPLES / f"{args.kernel}_{arch}.so"
            name = f"Executable emulated {path.name}"
            sizes[name] = path.stat().st_size
            cases[name] = case(path, tmp, lambda p: Executable(
                p, backend="emulated"), Executable.close)
        stats = T.interleave(cases, rounds, warmup=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import unicorn
    print(T.machine_line())
    print(f"unicorn {unicorn.__version__}; {rounds} rounds; a fresh copy of "
          f"the file per load")
    if peer is None:
        print("host architecture not run natively: no dlopen peer")
    rows = [[name, sizes[name], *T.stats_cells(s, stats.get(peer))]
            for name, s in stats.items()]
    print(T.table(["load", "bytes", "min", "median",
                   "ratio to dlopen (median)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
