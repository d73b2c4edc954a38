"""Our emulated backend against QEMU user mode, on the same machine code.

Usage: python bench/emulator_vs_qemu.py [--quick] [--rounds R]
           [--iterations N] [--target-seconds S] [--kernel K ...]
           [--arch A ...] [--engine qemu,unicorn] [--keep DIR]

The kernels are freestanding C in ``bench/kernels/`` (``matmul.c``: f32
matrix multiply; ``fill.c``: store-bound rewrite of a few MiB; ``crc32.c``:
load-bound table CRC over a few MiB). For every kernel and architecture
(x86_64, aarch64, riscv64) the source is compiled ONCE with ``python -m
ziglang cc`` (target flags from ``fatelf.arches``) into an object file, and
that object file is linked twice with ``ld.lld``:

* with ``init.c`` into a self-contained position-independent ET_DYN, which
  ``elfloader.load(..., backend="emulated", engine=E)`` loads, once per
  engine E (``--engine``, default both: ``qemu``, qemu-user running our
  guest agent in a child process; ``unicorn``, in this process); we time
  one ``backend.call(kernel, buffer, n)`` after warm-up calls (until a
  call is no faster than the one before: unicorn's TLB has grown to the
  working set, qemu has translated the code; the buffer is allocated and
  filled by ``bench_init`` beforehand);
* with ``init.c`` and ``qemu_start.c`` (``_start``, argument parsing, the
  Linux ``exit_group`` system call) into a static executable that fills
  the same buffer and calls the same kernel ITERATIONS times; it runs under
  ``qemu-<arch> -cpu MODEL``, where MODEL is the ``-cpu`` option our qemu
  engine starts its agent with (``backend._engine.cpu_option``: the most
  capable model), so both run the same CPU model. Both engines are
  compared with this one qemu-user run.

QEMU per-call time: each round runs the executable once with N iterations
and once with 1 iteration and takes ``(t_N - t_1) / (N - 1)``. N is picked
per kernel and architecture before the rounds: starting at
``--iterations``, it doubles until the N-call run lasts at least half of
``--target-seconds`` longer than the 1-call run, so that the spread of
process start-up is small next to the difference. Process
creation, QEMU start-up, loading, the buffer fill and the first call (which
includes translating the code) are in both runs and cancel out, as our
warm-up call and set-up are excluded from our figure. What remains on our
side besides the kernel is the Python overhead of one ``backend.call``
(argument set-up, ``emu_start`` for unicorn, one request and reply on
the agent's pipes for qemu), which belongs to what we measure.

The executable exits with the kernel's result & 0x7f; it must equal ours,
so both ran the same computation. The executable of the host's own
architecture is also run directly (column ``host``, same N-minus-1 method)
for scale.

Each round runs every case once, in an order rotated by one per round;
the table gives min and median per call, and ours / qemu-user per
engine. Column ``cpu ratio`` compares CPU time instead of wall time (ours:
the calling thread plus, for the qemu engine, the agent process,
``/proc/PID/task/*/schedstat``; qemu-user: ``getrusage`` of the finished
runs, N-call minus 1-call): on a shared machine wall time includes waiting
for a core, CPU time much less so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import _timing as T
from dispatch import loadavg

import elfloader
import fatelf.arches as A

HERE = Path(__file__).resolve().parent
KERNEL_DIR = HERE / "kernels"
ARCHES = ("x86_64", "aarch64", "riscv64")
ENGINES = ("qemu", "unicorn")

CFLAGS = ("-std=c17", "-fPIC", "-ffreestanding", "-fvisibility=hidden", "-O2",
          "-fno-stack-protector", "-fno-unwind-tables",
          "-fno-asynchronous-unwind-tables", "-g0", "-Wall", "-Werror")
SO_LINK = ("--build-id=none", "-nostdlib", "-static", "-shared", "--no-undefined",
           "--gc-sections", "-z", "now", "-z", "relro", "--hash-style=sysv")
EXE_LINK = ("--build-id=none", "-nostdlib", "-static", "--no-undefined",
            "--gc-sections", "-e", "_start")


@dataclass(frozen=True)
class Kernel:
    name: str          # kernel_<name> in <name>.c
    description: str
    n: int             # second argument of the call
    nbytes: int        # buffer size


def kernels() -> dict[str, Kernel]:
    mib = 1 << 20
    return {k.name: k for k in (
        Kernel("matmul", "f32 matmul 128x128x128", 128, 3 * 128 * 128 * 4),
        Kernel("fill", "store loop, 4 passes over 4 MiB", 4 * mib, 4 * mib),
        Kernel("crc32", "table CRC-32 of 4 MiB", 4 * mib, 4 * mib),
    )}


# --- building -----------------------------------------------------------------
def _zig(*args: str) -> None:
    cmd = [sys.executable, "-m", "ziglang", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def build(names: list[str], arches: list[str], out: Path) -> dict:
    """Compile each source once per architecture, link the ET_DYN and the
    static executable; returns (kernel, arch) -> (so path, exe path)."""
    # zig's cache in the per-user folder the build tools check (never a
    # fixed name in a shared temporary folder).
    from hal_cpu.buildtools.zig import cache_dir
    os.environ.setdefault("ZIG_GLOBAL_CACHE_DIR", str(cache_dir()))
    compiles = []
    for arch in arches:
        (out / arch).mkdir(parents=True, exist_ok=True)
        flags = A.lookup(arch).zig_flags
        for source in [*names, "init", "qemu_start"]:
            compiles.append(("cc", *flags, *CFLAGS, "-I", str(KERNEL_DIR), "-c",
                             str(KERNEL_DIR / f"{source}.c"), "-o",
                             str(out / arch / f"{source}.o")))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: _zig(*c), compiles))
    links, result = [], {}
    for arch in arches:
        d = out / arch
        for name in names:
            so, exe = d / f"{name}.so", d / f"{name}.exe"
            links.append(("ld.lld", *SO_LINK, str(d / f"{name}.o"), str(d / "init.o"),
                          "-o", str(so)))
            links.append(("ld.lld", *EXE_LINK, f"--defsym=bench_kernel=kernel_{name}",
                          str(d / f"{name}.o"), str(d / "init.o"),
                          str(d / "qemu_start.o"), "-o", str(exe)))
            result[name, arch] = so, exe
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: _zig(*c), links))
    return result


# --- measurements ---------------------------------------------------------------
class Ours:
    """One kernel loaded into an emulated backend, buffer filled, warmed up."""

    def __init__(self, so: Path, kernel: Kernel, engine: str):
        self.module = elfloader.load(so, backend="emulated", engine=engine)
        be = self.backend = self.module.backend
        self.addr = be.alloc(kernel.nbytes, 64)
        be.call(self.module.lookup("bench_init"), self.addr, kernel.nbytes)
        self.fn = self.module.lookup(f"kernel_{kernel.name}")
        self.n = kernel.n
        # Warm-up: unicorn grows its TLB (by doubling) only when it is
        # flushed between calls, so a kernel sweeping MiBs needs a few calls
        # before it stops refilling pages; qemu-user has no TLB but
        # translates the code on the first call. Calls until one is no
        # faster than the one before (at least 2, at most 8).
        last = float("inf")
        for _ in range(8):
            t = T.wall(lambda: be.call(self.fn, self.addr, self.n))()
            if t >= last * 0.95:
                break
            last = t
        self.result = be.call(self.fn, self.addr, self.n)
        self.cpu: list[float] = []

    def measure(self) -> float:
        """Wall seconds of one call; its CPU seconds go to :attr:`cpu`."""
        be, fn, addr, n = self.backend, self.fn, self.addr, self.n
        cpu0, thread0 = engine_cpu(be), time.thread_time()
        start = time.perf_counter()
        be.call(fn, addr, n)
        wall = time.perf_counter() - start
        self.cpu.append(engine_cpu(be) - cpu0 + time.thread_time() - thread0)
        return wall

    def close(self) -> None:
        self.module.close()
        self.backend.close()


class PerCall:
    """Per-call time of the executable run under ``prefix`` (qemu-<arch>, or
    nothing to run it directly): ``(t_N - t_1) / (N - 1)``."""

    def __init__(self, prefix: list[str], exe: Path, kernel: Kernel, rc: int,
                 iterations: int, target: float):
        self.argv = [*prefix, str(exe)]
        self.kernel, self.rc = kernel, rc
        self.cpu: list[float] = []
        t1, n = self._run(1)[0], iterations
        while self._run(n)[0] - t1 < target / 2 and n < 5000:
            n *= 2
        self.iterations = n

    def _run(self, n: int) -> tuple[float, float]:
        """(wall, CPU) seconds of one run with ``n`` calls."""
        cpu0 = T.children_cpu()
        wall = T.run_process([*self.argv, str(n), str(self.kernel.n),
                              str(self.kernel.nbytes)], check_rc=self.rc)
        return wall, T.children_cpu() - cpu0

    def measure(self, iterations: int | None = None) -> float:
        """Wall seconds per call; CPU seconds per call go to :attr:`cpu`."""
        n = iterations or self.iterations
        w1, c1 = self._run(1)
        wn, cn = self._run(n)
        self.cpu.append((cn - c1) / (n - 1))
        return (wn - w1) / (n - 1)


def engine_cpu(backend) -> float:
    """CPU seconds the engine of an emulated ``backend`` has used outside
    this process so far: the sum over the qemu engine's agent processes
    (:func:`_timing.pid_cpu`); 0 for the unicorn engine, which runs in the
    calling thread."""
    total = 0.0
    state = getattr(backend, "state", None)     # (emulated backends only)
    for cpu in list(state.cpus if state is not None else ()):
        agent = getattr(cpu, "_agent", None)
        if agent is not None and not agent.closed:
            try:
                total += T.pid_cpu(agent.pid)
            except OSError:
                pass
    return total


def median(values) -> float | None:
    return statistics.median(values) if values else None


def qemu_version(tool: str) -> str:
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    return out.splitlines()[0] if out else "?"


def engine_list(text: str) -> list[str]:
    """``qemu,unicorn`` -> ``["qemu", "unicorn"]`` (argparse type)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ENGINES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"engines are a comma-separated list of {', '.join(ENGINES)}")
    return list(dict.fromkeys(names))


def qemu_cpu_option(arch: str) -> str:
    """The ``-cpu`` option our qemu engine runs ``arch`` with when no
    profile is named (read from a backend, so the reference follows the
    engine)."""
    from elfloader.backend.emulated import EmulatedBackend
    backend = EmulatedBackend(elfloader.arch.by_name(arch), engine="qemu")
    try:
        return backend._engine.cpu_option
    finally:
        backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=5, quick_rounds=2)
    table = kernels()
    parser.add_argument("--iterations", type=int, default=5,
                        help="least number of calls in the long qemu run "
                             "(default 5)")
    parser.add_argument("--target-seconds", type=float, default=None,
                        help="about how much longer the N-call run lasts than "
                             "the 1-call run (default 1.0, --quick: 0.3)")
    parser.add_argument("--kernel", action="append", choices=list(table))
    parser.add_argument("--arch", action="append", choices=ARCHES)
    parser.add_argument("--engine", type=engine_list, default=list(ENGINES),
                        help="emulation engines to measure, comma-separated "
                             "(default qemu,unicorn)")
    parser.add_argument("--keep", metavar="DIR",
                        help="build into DIR and keep it (default: a temporary "
                             "directory, removed at exit)")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    iterations = args.iterations
    target = args.target_seconds or (0.3 if args.quick else 1.0)
    if iterations < 2:
        parser.error("--iterations must be at least 2")
    names = args.kernel or list(table)
    arches = args.arch or list(ARCHES)

    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_emu_"))
    try:
        builds = build(names, arches, out)
        import unicorn
        print(T.machine_line())
        print(f"unicorn {unicorn.__version__}; zig cc {' '.join(CFLAGS[:5])} ...; "
              f"{rounds} rounds; qemu: N-call run of about {target:g} s minus "
              f"1-call run")
        qemu = {a: shutil.which(f"qemu-{a}") for a in arches}
        for a, tool in qemu.items():
            if tool is None:
                print(f"qemu-{a} not found (apt-get install qemu-user): its "
                      f"column is left empty")
        seen = [t for t in qemu.values() if t]
        if seen:
            print(qemu_version(seen[0]))
        host = A.host()
        engines = args.engine
        if "qemu" in engines and not all(qemu.values()):
            print("the qemu engine needs qemu-user for every architecture: "
                  "it is left out")
            engines = [e for e in engines if e != "qemu"]
        cpu = {a: qemu_cpu_option(a) for a, tool in qemu.items() if tool}
        for a, option in cpu.items():
            print(f"qemu-user reference and qemu engine {a}: -cpu {option}")
        ours, cases, counts, cpu_of = {}, {}, {}, {}
        for name in names:
            kernel = table[name]
            for arch in arches:
                so, exe = builds[name, arch]
                results = set()
                for engine in engines:
                    o = ours[name, arch, engine] = Ours(so, kernel, engine)
                    results.add(o.result)
                    cases[f"ours-{engine} {name} {arch}"] = o.measure
                    cpu_of[name, arch, engine] = o.cpu
                if len(results) != 1:
                    raise RuntimeError(f"{name} {arch}: the engines disagree "
                                       f"on the result: {sorted(results)}")
                rc = results.pop() & 0x7F
                if qemu[arch]:
                    q = PerCall([qemu[arch], "-cpu", cpu[arch]], exe, kernel, rc,
                                iterations, target)
                    cases[f"qemu-user {name} {arch}"] = q.measure
                    cpu_of[name, arch] = q.cpu
                    counts[name, arch] = q.iterations
                if host is not None and host.name == arch:
                    h = PerCall([], exe, kernel, rc, iterations, target)
                    cases[f"host {name} {arch}"] = h.measure
        sys.stdout.flush()
        stats = T.interleave(cases, rounds, progress=True)
        for o in ours.values():
            o.close()
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)

    rows = []
    worst: dict[str, float] = {}
    worst_cpu: dict[str, float] = {}
    for name in names:
        for arch in arches:
            q = stats.get(f"qemu-user {name} {arch}")
            h = stats.get(f"host {name} {arch}")
            for engine in engines:
                s = stats[f"ours-{engine} {name} {arch}"]
                if q and q.ok and s.ok:
                    worst[engine] = max(worst.get(engine, 0.0), s.median / q.median)
                ours_cpu = median(cpu_of[name, arch, engine])
                qemu_cpu = median(cpu_of.get((name, arch), ()))
                if ours_cpu and qemu_cpu:
                    worst_cpu[engine] = max(worst_cpu.get(engine, 0.0),
                                            ours_cpu / qemu_cpu)
                rows.append([name, arch, engine, T.fmt_time(s.min),
                             T.fmt_time(s.median),
                             T.fmt_time(q.min) if q else "-",
                             T.fmt_time(q.median) if q else "-",
                             counts.get((name, arch), "-"),
                             T.ratio(s.median, q.median) if q else "-",
                             T.ratio(s.min, q.min) if q else "-",
                             T.ratio(ours_cpu, qemu_cpu),
                             T.fmt_time(h.median) if h else ""])
    print()
    print("per call (wall time); ratio = ours (engine) / qemu-user with the "
          "same -cpu; cpu ratio: the same with CPU time (median; ours: the "
          "calling thread plus the qemu engine's agent, qemu-user: the "
          "process), steadier than wall time on a busy machine")
    for name in names:
        print(f"  {name}: {table[name].description}")
    print(T.table(["kernel", "arch", "engine", "ours min", "ours median",
                   "qemu-user min", "qemu-user median", "N", "ratio (median)",
                   "ratio (min)", "cpu ratio", "host median"], rows))
    for engine, r in worst.items():
        print(f"largest ratio (median), {engine} engine: {r:.2f}x wall, "
              f"{worst_cpu.get(engine, 0):.2f}x cpu")
    print(f"load average at the end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
