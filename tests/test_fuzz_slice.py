"""A short deterministic slice of the fuzz harness (``python -m fuzz``):
mutated executables, plugins and FatELF bundles (also dispatched from threads
while closed, and given as FIFOs, devices, sparse files), on both backends, must be
accepted or rejected with a typed error. No other exception may escape, no
case may hang or exceed the memory and CPU limits, and the only crashes
allowed are native ones inside the file's own code (initializers, query,
dispatch, resolve, finalizers), which no verifier can judge: each is
recorded with its stage.

The ``code`` target (hostile machine code planted in a valid kernel's
dispatched export, run emulated) has a slice of its own per engine: no
case may change a canary of the host (a file, a listener, a process), and
the planted system calls must end in ``syscall`` faults. A positive
control runs the same planted calls with qemu-user outside the sandbox and
checks that the canaries see every one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLICE = ["--cases", "100", "--seed", "1", "--backend", "both", "--target", "all",
         "--jobs", "2"]


@pytest.fixture(scope="module")
def slice_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-slice")
    report = out / "report.json"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", *SLICE, "--report", str(report),
         "--out", str(out / "cases"), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout + proc.stderr
    return json.loads(report.read_text()), proc


def _totals(summary: dict) -> dict:
    out: dict[str, int] = {}
    for per in summary.values():
        for row in per.values():
            for k, v in row.items():
                out[k] = out.get(k, 0) + v
    return out


def test_slice_covers_every_target_and_backend(slice_report):
    report, _ = slice_report
    summary = report["summary"]
    assert sorted(summary) == ["elf", "fatelf", "files", "plugin", "threads"]
    for target, per in summary.items():
        assert sorted(per) == ["emulated", "native"], target
    assert sum(_totals(summary).values()) == 200
    # the mutations reach every stage: some files still load, most are refused
    totals = _totals(summary)
    assert totals["accepted"] > 0 and totals["typed"] > 0


@pytest.mark.parametrize("column", ["escape", "crash(host)", "hang", "hang(guest)", "blowup",
                                    "breach"])
def test_slice_has_no(slice_report, column):
    report, proc = slice_report
    assert _totals(report["summary"])[column] == 0, proc.stdout


def test_slice_crashes_only_in_native_guest_code(slice_report):
    report, proc = slice_report
    assert report["problem_count"] == 0, proc.stdout
    guest = [c for c in report["cases"] if c["column"] in ("crash(guest)", "hang(guest)")]
    for case in guest:
        assert case["backend"] == "native", case
        assert case["stage"].split("/")[0] in (
            "init", "query", "dispatch", "resolve", "close"), case
        # inside a call of the file's code, or after one when the same file
        # is clean on the emulated backend
        assert case["in_guest"] or case.get("emulated_replay") in ("accepted", "typed"), case
    assert proc.returncode == 0, proc.stdout


def test_cases_are_deterministic():
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import corpus
    c = corpus.Corpus()
    for backend in corpus.BACKENDS:
        for i in range(30):
            a = corpus.make_case(c, 1, backend, i, corpus.TARGETS)
            b = corpus.make_case(c, 1, backend, i, corpus.TARGETS)
            assert a == b
            assert corpus.case_data(c, a) == corpus.case_data(c, b)


# --- target code: hostile machine code, emulated --------------------------------------
CODE_CASES = 30


def _qemu_ready() -> bool:
    import elfloader
    from elfloader.backend.emulated import choice, sandbox
    return bool(sandbox.status()["seccomp"]) and all(
        choice.qemu_program(elfloader.arch.by_name(a)) for a in
        ("x86_64", "x86_32", "aarch64", "arm32", "riscv64", "riscv32"))


ENGINES = [pytest.param("unicorn"),
           pytest.param("qemu", marks=pytest.mark.skipif(
               not _qemu_ready(), reason="qemu-user or its sandbox missing"))]


@pytest.fixture(scope="module", params=ENGINES)
def code_report(request, tmp_path_factory):
    engine = request.param
    out = tmp_path_factory.mktemp(f"fuzz-code-{engine}")
    report = out / "report.json"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz", "--target", "code", "--engine", engine,
         "--cases", str(CODE_CASES), "--seed", "1", "--jobs", "2", "--report", str(report),
         "--out", str(out / "cases"), "--quiet", "--no-minimize"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert report.exists(), proc.stdout + proc.stderr
    return engine, json.loads(report.read_text()), proc


def test_code_slice_leaves_the_host_alone(code_report):
    engine, report, proc = code_report
    rows = report["summary"]["code"]
    assert list(rows) == [f"emulated/{engine}"], rows
    row = rows[f"emulated/{engine}"]
    assert sum(row.values()) == CODE_CASES
    for column in ("breach", "escape", "crash(host)", "hang", "hang(guest)", "blowup"):
        assert row[column] == 0, (column, proc.stdout)
    assert report["problem_count"] == 0, proc.stdout
    assert proc.returncode == 0, proc.stdout
    assert all(c["engine"] == engine for c in report["cases"])


def test_code_slice_makes_system_calls(code_report):
    """The planted sequences run: many cases end in a 'syscall' fault,
    with the call's name."""
    engine, report, _ = code_report
    faults = report["faults"][f"code/emulated/{engine}"]
    assert faults["syscall"] >= CODE_CASES // 5, faults
    names = faults["syscall_names"]
    assert any(n in names for n in ("openat", "open", "execve", "socket", "kill",
                                    "unlinkat", "mkdirat", "clone")), names


def test_code_cases_are_deterministic_and_stay_in_the_export():
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import code, corpus
    c = corpus.Corpus()
    arches = set()
    for i in range(60):
        a = corpus.make_case(c, 3, "emulated", i, ("code",))
        assert a == corpus.make_case(c, 3, "emulated", i, ("code",))
        start, end, _ = a["region"]
        seed = c.seed(a["seed"]).data
        data = corpus.case_data(c, a)
        assert len(data) == len(seed)
        changed = [k for k in range(len(seed)) if seed[k] != data[k]]
        assert all(start <= k < end for k in changed), a["mutations"]
        arches.add(a["arch"])
        # the same plan against other canaries: other bytes, same shape
        b = corpus.replan(c, a, code.placeholder_env(i + 1000))
        assert b["plan"] == a["plan"] and len(b["ops"]) == len(a["ops"])
    assert len(arches) == 6
    assert corpus.make_case(c, 3, "native", 0, ("elf",))["backend"] == "native"
    with pytest.raises(SystemExit):
        corpus.make_case(c, 3, "native", 0, ("code",))


@pytest.mark.skipif(not _qemu_ready(), reason="qemu-user missing")
def test_code_positive_control():
    """Outside the sandbox the planted calls do reach the host, on all six
    architectures, and the canaries see each of them."""
    proc = subprocess.run([sys.executable, "-m", "fuzz", "--control"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "90 of 90 planted calls changed a canary" in proc.stdout, proc.stdout


#: What the test below guards against: a guest that makes its qemu agent
#: deaf to its host (its request pipe, which the agent's watchdog polls for
#: the host's end, replaced by /dev/null with dup3) would leave the agent
#: running guest code, orphaned, for ever once the host dies mid-call. The
#: filter refuses close and dup over the agent's own descriptors.
ORPHAN_AGENT = "a qemu agent outlived its killed host"


@pytest.mark.skipif(not _qemu_ready(), reason="qemu-user or its sandbox missing")
def test_code_agent_ends_with_a_killed_host(tmp_path):
    """A host process killed during a call of hostile code leaves no agent."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from fuzz import cli, code, corpus
    c = corpus.Corpus()
    case = corpus.make_case(c, 1, "emulated", 0, ("code",))
    seed = next(s for s in c.seeds["code"] if s.arch == "x86_64" and s.kernel == "mul_add")
    case = dict(case, seed=seed.path, arch="x86_64", kernel="mul_add", engine="qemu",
                plan=[{"kind": "plant", "seed": 1, "call": "orphan", "at": "entry"}],
                region=list(code.export_range(seed.model)), kill_host_after=0.5)
    case = corpus.replan(c, case, code.placeholder_env(0))
    args = cli.build_parser().parse_args([])
    case["_opts"] = cli.case_opts(cli.child_opts(args, "emulated"), case, c.manifest)
    saved = cli.save_case(tmp_path, case, {"outcome": "?"}, corpus.case_data(c, case))
    proc = subprocess.run([sys.executable, "-m", "fuzz", "--replay", str(saved),
                           "--engine", "qemu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert "now: killed" in proc.stdout or "now: breach" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "outlived its case" not in proc.stdout, (ORPHAN_AGENT, proc.stdout)
    assert "breach:" not in proc.stdout, proc.stdout


def test_code_assembler_loads_constants():
    """fuzz.asm's constant loads give the value on each architecture
    (run on unicorn)."""
    import random

    import unicorn as uc
    from unicorn import arm64_const, arm_const, riscv_const, x86_const

    from fuzz.asm import ASSEMBLERS
    cpus = {"x86_64": (uc.UC_ARCH_X86, uc.UC_MODE_64, 10, x86_const.UC_X86_REG_R10),
            "x86_32": (uc.UC_ARCH_X86, uc.UC_MODE_32, 6, x86_const.UC_X86_REG_ESI),
            "aarch64": (uc.UC_ARCH_ARM64, uc.UC_MODE_ARM, 3, arm64_const.UC_ARM64_REG_X3),
            "arm32": (uc.UC_ARCH_ARM, uc.UC_MODE_ARM, 3, arm_const.UC_ARM_REG_R3),
            "riscv64": (uc.UC_ARCH_RISCV, uc.UC_MODE_RISCV64, 10,
                        riscv_const.UC_RISCV_REG_A0),
            "riscv32": (uc.UC_ARCH_RISCV, uc.UC_MODE_RISCV32, 10,
                        riscv_const.UC_RISCV_REG_A0)}
    rng = random.Random(5)
    values = [0, 1, -1, -100, 2047, 2048, 0xFFFF, 0x10000, (1 << 31) - 1, 1 << 31,
              (1 << 31) - 0x800, 1 << 32, 0xFFFFFFFFFF600000, 1 << 63]
    values += [rng.getrandbits(64) for _ in range(40)] + [rng.getrandbits(24) for _ in range(20)]
    for arch, (a, mode, reg, reg_id) in cpus.items():
        asm = ASSEMBLERS[arch]
        mask = (1 << (8 * asm.ptr)) - 1
        for v in values:
            raw = asm.li(reg, v)
            cpu = uc.Uc(a, mode)
            cpu.mem_map(0x1000, 0x1000)
            cpu.mem_write(0x1000, raw)
            cpu.emu_start(0x1000, 0x1000 + len(raw))
            assert cpu.reg_read(reg_id) & mask == v & mask, (arch, hex(v))
