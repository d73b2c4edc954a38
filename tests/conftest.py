"""Shared fixtures: programs compiled by iree-compile once per session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.cli.demo import MUL_PARAMS
from hal_cpu.programs import Compiled, compile_program

from program_specs import ALL_PROGRAMS

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "sample_plugins" / "prebuilt"


def default_sigint() -> None:
    """``preexec_fn`` of a child a test interrupts: Ctrl-C's default action,
    whatever this process inherited (a shell starts background jobs with
    SIGINT ignored, and Python then installs no KeyboardInterrupt)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- system packages a test needs: @pytest.mark.requires("qemu-user") ------
def _qemu_user() -> str | None:
    from elfloader.backend.emulated import qemu_program
    missing = [a for a in arches.RUNTIME_ARCHES if not qemu_program(a)]
    return f"qemu-{missing[0]} is not on PATH" if missing else None


def _on_path(*programs: str):
    def check() -> str | None:
        absent = [p for p in programs if shutil.which(p) is None]
        return f"{absent[0]} is not on PATH" if absent else None
    return check


#: system package (as ``@pytest.mark.requires`` names it) -> check returning
#: None when it is installed, else why it counts as missing. Add a row for a
#: new package; a name not in this table is a usage error.
SYSTEM_PACKAGES = {
    "qemu-user": _qemu_user,
    "gdb-multiarch": _on_path("gdb-multiarch"),
}


def missing_package(name: str) -> str | None:
    """Why system package ``name`` (a key of SYSTEM_PACKAGES) is missing, or
    None when it is installed. Looked up on each call (PATH may change)."""
    if name not in SYSTEM_PACKAGES:
        raise pytest.UsageError(f"@pytest.mark.requires({name!r}): unknown system package; "
                                f"known: {', '.join(sorted(SYSTEM_PACKAGES))}")
    return SYSTEM_PACKAGES[name]()


def requires(*packages: str) -> pytest.MarkDecorator:
    """The marker of a test that needs system ``packages``."""
    return pytest.mark.requires(*packages)


def pytest_runtest_setup(item) -> None:
    """Skips a test marked ``requires(...)`` whose package is missing, with the
    reason; with CI=true a missing package fails the test instead (CI installs
    them, so their absence there is a broken machine, not a choice)."""
    for mark in item.iter_markers("requires"):
        for name in mark.args:
            why = missing_package(name)
            if why is None:
                continue
            message = f"requires {name}: {why}"
            if os.environ.get("CI") == "true":
                pytest.fail(f"{message} (CI=true: install it)", pytrace=False)
            pytest.skip(message)


def emulation_engines() -> list[str]:
    """Engines the backend-level tests run on: unicorn and qemu. A test whose
    parameter is ``"qemu"`` gets ``requires("qemu-user")`` at collection
    (pytest_collection_modifyitems), so a machine without qemu-user skips it
    and CI (where its absence is a failure) fails it."""
    return ["unicorn", "qemu"]


#: qemu-user's -cpu option or engine spelled on a command line, as the CLI
#: (``--engine``, ``--cpu``, ``--vlen``) and the pytest plugin (``--hal-...``)
#: take them.
_ENGINE_FLAG = re.compile(r"--(?:hal-)?engine[= ](\w+)")
_CPU_FLAG = re.compile(r"--(?:hal-)?cpu[= ]['\"]?([^\s'\";]+)")
#: The workbench's flags (sanitizer, instruction counts): qemu's TCG plugin.
_WORKBENCH_FLAG = re.compile(r"--(?:sanitize|count_instructions|hal-sanitize"
                             r"|hal-count-instructions)\b")


def needs_qemu(command: str) -> bool:
    """Whether a command line (a ``hal-cpu``/``pytest`` invocation, a docs
    example) runs only on the qemu engine: ``--engine=qemu`` or
    ``--hal-engine=qemu``, ``--vlen``, a workbench flag (``--sanitize``,
    ``--count_instructions`` and the pytest plugin's), or a ``--cpu``/``--hal-cpu`` profile
    unicorn cannot run (``Profile.unicorn`` in fatelf.arches) with no
    ``--engine=unicorn`` (which makes the command an error to show)."""
    engines = set(_ENGINE_FLAG.findall(command))
    if "qemu" in engines:
        return True
    if "unicorn" in engines:
        return False
    if "--vlen" in command or _WORKBENCH_FLAG.search(command):
        return True
    for value in _CPU_FLAG.findall(command):
        for spec in value.split(";"):
            name = spec.split(":", 1)[0].rsplit("/", 1)[-1].lower()
            if any(p.name == name and not p.unicorn for p in arches.PROFILES):
                return True
    return False


_DEBUG = re.compile(r"\bhal-cpu debug\b")


def system_packages(command: str) -> tuple[str, ...]:
    """The system packages (keys of SYSTEM_PACKAGES) a command line needs:
    qemu-user when :func:`needs_qemu`; both qemu-user and gdb-multiarch for
    ``hal-cpu debug`` (a dispatch under qemu-user's gdb stub), unless it is
    given ``--engine=unicorn`` (then it is an error to show)."""
    debug = bool(_DEBUG.search(command)) and "unicorn" not in _ENGINE_FLAG.findall(command)
    qemu = needs_qemu(command) or debug
    return (("qemu-user",) if qemu else ()) + (("gdb-multiarch",) if debug else ())


def _param_packages(value) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ()
    return ("qemu-user",) if value == "qemu" else system_packages(value)


def pytest_collection_modifyitems(config, items) -> None:
    """The rule that marks tests needing system packages: a test
    parametrized with the engine ``"qemu"`` (any parameter, fixtures'
    ``params`` included) or with a command line that needs a package
    (:func:`system_packages`) gets ``requires(...)`` naming them."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        needed = {p for v in callspec.params.values() for p in _param_packages(v)}
        if needed:
            item.add_marker(requires(*sorted(needed, reverse=True)))


#: A git checkout of IREE's source (``PKR_IREE_SOURCE``), for the tests that
#: check against IREE's own test programs and tables; they skip without it.
IREE_SOURCE = Path(os.environ.get("PKR_IREE_SOURCE",
                                  "/work/.mirror/iree-org+iree/repo"))


def iree_source_file(path: str) -> str:
    """The text of ``path`` (relative to IREE's repository root) at the
    checkout's HEAD; skips the test when the checkout is not there."""
    try:
        return subprocess.run(["git", "-C", str(IREE_SOURCE), "show", f"HEAD:{path}"],
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"IREE's source is not at {IREE_SOURCE} (set PKR_IREE_SOURCE)")


@pytest.fixture
def each_engine(request, monkeypatch):
    """Runs the test on the engine named by its parameter (``PKR_ENGINE``);
    modules opt in with ``pytestmark = pytest.mark.parametrize("each_engine",
    emulation_engines(), indirect=True)`` and an autouse of this fixture."""
    monkeypatch.setenv("PKR_ENGINE", request.param)
    return request.param


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """Directory where compiled programs are cached for the session.

    Set PKR_COMPILE_CACHE to keep them across sessions."""
    env = os.environ.get("PKR_COMPILE_CACHE")
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return tmp_path_factory.mktemp("iree-compiled")


@pytest.fixture(scope="session")
def compiled(compile_cache):
    """compiled(program_name, arch, cpu=None) -> hal_cpu.programs.Compiled
    (cached; ``cpu`` a CPU profile of ``arch``)."""
    def get(program: str, arch: str, cpu: str | None = None) -> Compiled:
        return compile_program(ALL_PROGRAMS[program].path, arch, compile_cache,
                               cpu=cpu)
    return get


@pytest.fixture(scope="session")
def elementwise_so(compiled) -> Path:
    """A real x86_64 executable library (mul_add) as a path."""
    return compiled("mul_add", "x86_64").so_files[0]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# --- tiny real ELFs built with zig, for the FatELF tests ----------------------
C_SOURCE = "int fatelf_test_add(int a, int b) { return a + b; }\n"
C_SOURCE_V2 = "int fatelf_test_add(int a, int b) { return a * b + 7; }\n"
#: arch name -> zig target flags: the runtime's six from the architecture
#: table, plus a big-endian target FatELF must also carry.
ZIG_TARGETS = {**{name: arches.lookup(name).zig_flags for name in arches.RUNTIME_ARCHES},
               "aarch64_be": ("-target", "aarch64_be-freestanding-none")}


def _zig(args, cwd):
    subprocess.run([sys.executable, "-m", "ziglang", *args], cwd=cwd, check=True,
                   capture_output=True)


def _build_so(workdir: Path, flags, source: str, out: str) -> Path:
    path = workdir / out
    if not path.exists():
        _zig(["cc", *flags, "-fPIC", "-ffreestanding",
              "-nostdlib", "-O2", "-c", "-o", f"{out}.o", source], workdir)
        _zig(["ld.lld", "-shared", "-o", out, f"{out}.o"], workdir)
    return path


@pytest.fixture(scope="session")
def elf_files(tmp_path_factory) -> dict[str, Path]:
    """arch name -> path of a tiny real ELF for each of ZIG_TARGETS, plus
    ``x86_64_v2`` (same target, other code)."""
    pytest.importorskip("ziglang")
    workdir = tmp_path_factory.mktemp("fatelf-elfs")
    (workdir / "a.c").write_text(C_SOURCE)
    (workdir / "b.c").write_text(C_SOURCE_V2)
    jobs = {name: (flags, "a.c", f"{name}.so") for name, flags in ZIG_TARGETS.items()}
    jobs["x86_64_v2"] = (ZIG_TARGETS["x86_64"], "b.c", "x86_64_v2.so")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(_build_so, workdir, *v) for k, v in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def process_memory() -> dict[str, int]:
    """VmRSS and VmSize of this process, in bytes (/proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize"):
                out[key] = int(value.split()[0]) * 1024
    return out


#: The params struct of the sample plugins' ``simple_mul_workgroup`` import
#: (sample_plugins/sample_common.h, mul_params_t), as the package describes it.
SIMPLE_MUL = MUL_PARAMS
