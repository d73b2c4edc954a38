"""Emulation is a sandbox: code under emulation cannot reach the host
through system calls, on either engine and on all six architectures.

The hostile code is C built here with zig (cached for the session):

* ``tests/plugins/hostile.c``: an executable plugin whose load parameter
  ``syscall=NAME`` picks a case of ``tests/plugins/hostile_cases.h``
  (raw system calls, ``tests/plugins/hostile_syscall.h``), run in ``load``
  (or, with ``when=call``, in its imports ``hostile_syscall`` and
  ``simple_mul_workgroup``);
* ``tests/plugins/hostile_executable.c``: an executable library whose export
  ``hostile_dispatch`` runs the case its first push constant names;
* both built again with ``-DHOSTILE_INIT=<case>``: the case runs from an
  initializer while the file is loaded.

Each case aims at something the test can see on the host: a marker file
made by ``openat``, by ``/bin/sh`` after ``execve`` or by the child of a
``clone``; a file removed (``unlinkat``) or renamed (``renameat``); a
connection accepted by a listener on 127.0.0.1 (``socket`` + ``connect``);
a ``sleep`` process killed (``kill``, ``tgkill``), traced (``ptrace``) or
read (``process_vm_readv``); host memory used (``mmap`` of 64 GiB, then
1.5 GiB written); signals ignored before an endless loop
(``rt_sigaction``). Every case must end in a typed error: an
:class:`elfloader.EmulationError` with ``fault.kind == "syscall"``, the call's
number and name, and a report naming the system call, the function that
made it and the address of the system-call instruction. Afterwards nothing
on the host has changed and no process is left.

On the qemu engine qemu-user runs some calls itself, without asking the
host, and some the sandbox allows (qemu needs them): there the guest may
get the call's error instead of a fault, and the test accepts it, as long
as the host is untouched:

* ``mmap``: allowed; the sandbox bounds the address space, so the guest
  gets ENOMEM (load status RESOURCE_EXHAUSTED, export returns 12);
* ``ptrace``, ``process_vm_readv``: qemu-user 7.2 does not implement them
  (ENOSYS without a host call: status UNIMPLEMENTED, export returns 38);
* ``rt_sigaction``: allowed (qemu-user handles signals): the endless loop
  after it must still end at the time limit.

Entry points: the Python API (``PluginManager`` loading with parameters,
``Executable`` dispatch, an import called by a dispatch) for every case,
architecture and engine; ``hal-cpu inspect``, ``hal-cpu run`` (the export,
the initializer build, ``--executable_plugin``), ``hal-cpu run-module``
and the pytest fixtures (an inner pytest session) with the cases
``openat`` and ``execve``, on every architecture with qemu and on two with
unicorn. qemu cases are skipped when ``qemu-aarch64`` is not installed,
except on CI (``CI=true``).
"""

from __future__ import annotations

import ctypes
import io
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

import elfloader
from fatelf import PortableKernelError, arches

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"
ARCHES = list(arches.RUNTIME_ARCHES)
#: The architectures the command-line and fixture entry points use with
#: unicorn (every architecture with qemu).
UNICORN_CLI_ARCHES = ["x86_64", "arm32"]
#: Cases of the entry points other than the Python API.
CLI_CASES = ["openat", "execve"]

# --- the cases -----------------------------------------------------------------
#: Case name (``syscall=`` parameter) -> number (the executable's first push
#: constant); tests/plugins/hostile_cases.h.
CASES = {"openat": 1, "unlinkat": 2, "renameat": 3, "execve": 4, "socket": 5,
         "kill": 6, "tgkill": 7, "ptrace": 8, "process_vm_readv": 9,
         "clone": 10, "mmap": 11, "rt_sigaction": 12}
#: The constant that makes the export call the import ``hostile_syscall``.
CALL_IMPORT = 13

_ORDER = ("x86_64", "aarch64", "riscv64", "x86_32", "arm32", "riscv32")


def _table(*numbers, names=None):
    names = names or {}
    return {arch: (names.get(arch), n) for arch, n in zip(_ORDER, numbers)}


#: Case -> architecture -> (name, number) of the first system call the case
#: makes, from each architecture's Linux table (name None: the case's name).
SYSCALLS = {
    "openat": _table(257, 56, 56, 295, 322, 56),
    "unlinkat": _table(263, 35, 35, 301, 328, 35),
    "renameat": _table(264, 38, 276, 302, 329, 276,
                       names={"riscv64": "renameat2", "riscv32": "renameat2"}),
    "execve": _table(59, 221, 221, 11, 11, 221),
    "socket": _table(41, 198, 198, 359, 281, 198),
    "kill": _table(62, 129, 129, 37, 37, 129),
    "tgkill": _table(234, 131, 131, 270, 268, 131),
    "ptrace": _table(101, 117, 117, 26, 26, 117),
    "process_vm_readv": _table(310, 270, 270, 347, 376, 270),
    "clone": _table(56, 220, 220, 120, 120, 220),
    "mmap": _table(9, 222, 222, 192, 192, 222,
                   names={"x86_32": "mmap2", "arm32": "mmap2"}),
    "rt_sigaction": _table(13, 134, 134, 174, 174, 134),
}
#: Names also accepted: riscv32 shares the generic table with riscv64,
#: where 222 is ``mmap`` (the riscv32 kernel calls it ``mmap2``).
OTHER_NAMES = {("mmap", "riscv32"): {"mmap2"}}


def syscall_of(case: str, arch: str) -> tuple[str, int]:
    name, number = SYSCALLS[case][arch]
    return name or case, number


#: How each architecture's system-call instruction disassembles, and its
#: bytes (little endian; arm32 code is ARM, not Thumb).
INSTRUCTIONS = {
    "x86_64": ("syscall", bytes.fromhex("0f05")),
    "x86_32": ("int 0x80", bytes.fromhex("cd80")),
    "aarch64": ("svc #0", bytes.fromhex("010000d4")),
    "arm32": ("svc #0", bytes.fromhex("000000ef")),
    "riscv64": ("ecall", bytes.fromhex("73000000")),
    "riscv32": ("ecall", bytes.fromhex("73000000")),
}

#: Time limit, seconds, of a call that should fault at once; and of the
#: endless loop after rt_sigaction (the limit must end it).
LIMIT = 30.0
LOOP_LIMIT = 1.0
#: Seconds an ended call may take past LOOP_LIMIT.
LOOP_GRACE = 15.0
#: MiB the mmap case writes to: more than the qemu sandbox's 1 GiB bound.
TOUCH_MIB = 1536


def limit_of(case: str) -> float:
    return LOOP_LIMIT if case == "rt_sigaction" else LIMIT


# --- engines -------------------------------------------------------------------
def _have_qemu() -> bool:
    from elfloader.backend.emulated import qemu_program
    return bool(qemu_program("aarch64"))


QEMU = pytest.mark.skipif(not _have_qemu() and os.environ.get("CI") != "true",
                          reason="qemu-user (qemu-aarch64) is not installed")


def engine_arch_params(arches_of_unicorn=ARCHES, cases=None):
    """pytest params (engine, arch[, case]): qemu on every architecture,
    unicorn on ``arches_of_unicorn``."""
    out = []
    for engine, archs in (("qemu", ARCHES), ("unicorn", arches_of_unicorn)):
        for arch in archs:
            for case in cases or [None]:
                values = (engine, arch) if case is None else (engine, arch, case)
                out.append(pytest.param(*values, marks=[QEMU] if engine == "qemu" else [],
                                        id="-".join(values)))
    return out


# --- the builds ----------------------------------------------------------------
@dataclass
class Builds:
    """The hostile files of this session; ``elves[(file, arch)]`` the ELF
    bytes of each record (``file``: "plugin", "executable",
    "init_plugin:CASE", "init_executable:CASE")."""

    directory: Path
    plugin: Path
    executable: Path
    init_plugin: dict[str, Path] = field(default_factory=dict)
    init_executable: dict[str, Path] = field(default_factory=dict)
    #: marker path baked into the initializer builds: (kind, case) -> path
    init_marker: dict[tuple[str, str], Path] = field(default_factory=dict)
    elves: dict[tuple[str, str], bytes] = field(default_factory=dict)


def _executable_bundle(work: Path, stem: str, defines=()) -> tuple[bytes, dict]:
    """(FatELF bundle, architecture -> ELF) of hostile_executable.c."""
    import fatelf
    from hal_cpu.buildtools import zig as zigbuild
    objects = [zigbuild.build_freestanding(
        "hostile_executable.c", arch, cwd=PLUGINS, work_dir=work, stem=stem,
        defines=list(defines), exports=["iree_hal_executable_library_query"],
        debug=True) for arch in ARCHES]
    return (fatelf.join(objects, names=[f"{stem}_{a}.so" for a in ARCHES]),
            dict(zip(ARCHES, objects)))


def _plugin_bundle(defines=()) -> tuple[bytes, dict]:
    """(FatELF bundle, architecture -> ELF) of hostile.c."""
    import fatelf
    from hal_cpu.buildtools import zig as zigbuild
    data = zigbuild.build_plugin([PLUGINS / "hostile.c"], "all", debug=True,
                                 defines=list(defines), jobs=2)
    return data, {arches.lookup(record.arch).name: elf
                  for record, elf in fatelf.split(data)}


@pytest.fixture(scope="session")
def hostile(tmp_path_factory) -> Builds:
    """hostile.c, hostile_executable.c and their initializer builds (cases
    openat and execve, each with its own marker path) for the six
    architectures, with -g."""
    pytest.importorskip("ziglang")
    work = tmp_path_factory.mktemp("hostile")
    markers = work / "init-markers"
    markers.mkdir()
    jobs = {"plugin": lambda: _plugin_bundle(),
            "executable": lambda: _executable_bundle(work, "hostile_executable")}
    builds = Builds(work, work / "hostile.sos", work / "hostile_executable.sos")
    for case in CLI_CASES:
        for kind in ("plugin", "executable"):
            marker = markers / f"{kind}-{case}"
            builds.init_marker[(kind, case)] = marker
            defines = [f"-DHOSTILE_INIT={CASES[case]}",
                       f'-DHOSTILE_PATH="{marker}"']
            if kind == "plugin":
                jobs[f"init_plugin:{case}"] = (
                    lambda d=defines: _plugin_bundle(d))
            else:
                jobs[f"init_executable:{case}"] = (
                    lambda d=defines, c=case: _executable_bundle(
                        work, f"hostile_init_{c}", d))
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {key: pool.submit(job) for key, job in jobs.items()}
        results = {key: f.result() for key, f in done.items()}
    for key, (bundle, elves) in results.items():
        if key == "plugin":
            path = builds.plugin
        elif key == "executable":
            path = builds.executable
        else:
            kind, case = key.split(":")
            path = work / f"hostile_{kind}_{case}.sos"
            getattr(builds, kind)[case] = path
        path.write_bytes(bundle)
        for arch, elf in elves.items():
            builds.elves[(key, arch)] = elf
    return builds


# --- the host ------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_CHILD_SUBREAPER = 36


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        out[int(entry)] = (int(fields[1]), fields[0])
    return out


def _descendants(root: int) -> dict[int, str]:
    """pid -> state of every descendant of ``root``."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = procs[pid][1]
        todo += children.get(pid, [])
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _status_field(pid: int, key: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == key:
                    return value.strip()
    except OSError:
        return None
    return None


class Host:
    """What the hostile code aims at, made for one test, and the checks
    that it is all still as it was.

    Attributes:
        marker: a file that must not appear (openat, execve, clone).
        victim, renamed: a file that must stay, a name that must not
            appear (unlinkat, renameat).
    """

    VICTIM_TEXT = b"must stay\n"

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.marker = directory / "marker"
        self.victim = directory / "victim"
        self.renamed = directory / "renamed"
        self.victim.write_bytes(self.VICTIM_TEXT)
        self.extra_markers: list[Path] = []
        self._sleeper: subprocess.Popen | None = None
        self._listener: socket.socket | None = None
        self.sigusr1 = signal.getsignal(signal.SIGUSR1)
        # Orphans of what the test starts become this process's children,
        # where the leftover check sees them.
        self._reaper = _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        self.baseline = set(_descendants(os.getpid()))

    # -- targets --
    @property
    def sleeper(self) -> subprocess.Popen:
        if self._sleeper is None:
            self._sleeper = subprocess.Popen(["sleep", "600"])
        return self._sleeper

    @property
    def port(self) -> int:
        if self._listener is None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(8)
        return self._listener.getsockname()[1]

    def readable_address(self) -> int:
        """The start of the sleeper's first mapping."""
        with open(f"/proc/{self.sleeper.pid}/maps") as f:
            return int(f.readline().split("-")[0], 16)

    def params(self, case: str) -> dict[str, str]:
        """The plugin's load parameters for ``case``."""
        p = {"syscall": case}
        if case in ("openat", "execve", "clone"):
            p["path"] = str(self.marker)
        elif case == "unlinkat":
            p["path"] = str(self.victim)
        elif case == "renameat":
            p["path"], p["path2"] = str(self.victim), str(self.renamed)
        elif case == "socket":
            p["port"] = str(self.port)
        elif case in ("kill", "tgkill", "ptrace"):
            p["pid"] = str(self.sleeper.pid)
        elif case == "process_vm_readv":
            p["pid"] = str(self.sleeper.pid)
            p["addr"] = hex(self.readable_address())
        elif case == "mmap":
            p["touch_mib"] = str(TOUCH_MIB)
        return p

    def dispatch_args(self, case: str) -> tuple[list[np.ndarray], list[int]]:
        """The executable's bindings (path, path2) and constants for
        ``case``."""
        p = self.params(case)
        number = int(p.get("pid") or p.get("port") or p.get("touch_mib") or 0)
        addr = int(p.get("addr", "0"), 16)
        constants = [CASES[case], number, addr & 0xFFFFFFFF, addr >> 32]
        return [path_binding(p.get("path", "")),
                path_binding(p.get("path2", ""))], constants

    # -- checks --
    def check(self, what: str = "") -> None:
        """Assert that nothing the hostile code aimed at has changed and
        that no process the test started is left."""
        where = f" ({what})" if what else ""
        try:
            self._check(where)
        finally:
            self.reset()

    def _check(self, where: str) -> None:
        markers = [self.marker, *self.extra_markers]
        deadline = time.monotonic() + 0.3       # sh and a fork's child run on
        while time.monotonic() < deadline and not any(m.exists() for m in markers):
            time.sleep(0.05)
        made = [str(m) for m in markers if m.exists()]
        assert not made, f"the guest made files on the host{where}: {made}"
        assert self.victim.exists(), f"the guest removed {self.victim}{where}"
        assert self.victim.read_bytes() == self.VICTIM_TEXT, \
            f"the guest changed {self.victim}{where}"
        assert not self.renamed.exists(), \
            f"the guest renamed {self.victim} to {self.renamed}{where}"
        if self._listener is not None:
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            assert not ready, f"the guest connected to 127.0.0.1:{self.port}{where}"
        if self._sleeper is not None:
            pid = self._sleeper.pid
            assert self._sleeper.poll() is None, \
                f"the guest killed the sleeper (pid {pid}){where}"
            tracer = _status_field(pid, "TracerPid")
            assert tracer in (None, "0"), \
                f"the guest traces the sleeper (pid {pid}, tracer {tracer}){where}"
        assert signal.getsignal(signal.SIGUSR1) == self.sigusr1, \
            f"the guest changed this process's SIGUSR1 handler{where}"
        left = self._leftovers()
        assert not left, f"processes left after the call{where}: {left}"

    def _leftovers(self) -> dict[int, str]:
        """New descendants still there after a grace period (zombies among
        them are reaped), pid -> command line."""
        known = set(self.baseline)
        if self._sleeper is not None:
            known.add(self._sleeper.pid)
        deadline = time.monotonic() + 5.0
        while True:
            new = {p: s for p, s in _descendants(os.getpid()).items()
                   if p not in known}
            if not new or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        left = {p: f"{_cmdline(p)} [{s}]" for p, s in new.items()}
        for pid, state in new.items():
            if state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        return left

    def reset(self) -> None:
        """Undo whatever an escape changed, for the next check."""
        for m in (self.marker, self.renamed, *self.extra_markers):
            m.unlink(missing_ok=True)
        if not self.victim.exists() or self.victim.read_bytes() != self.VICTIM_TEXT:
            self.victim.write_bytes(self.VICTIM_TEXT)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._sleeper is not None:
            self._sleeper.kill()
            self._sleeper.wait()
            self._sleeper = None
        if signal.getsignal(signal.SIGUSR1) != self.sigusr1:
            signal.signal(signal.SIGUSR1, self.sigusr1)

    def close(self) -> None:
        self.reset()
        if self._reaper:
            _libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path / "host")
    yield h
    h.close()


def path_binding(path: str) -> np.ndarray:
    """A binding holding ``path`` NUL-terminated (512 bytes)."""
    import hal_cpu
    data = path.encode()
    assert len(data) < 512, path
    buf = hal_cpu.zeros(512, np.uint8)
    buf[:len(data)] = np.frombuffer(data, np.uint8)
    return buf


# --- what an outcome must look like -------------------------------------------
_PC_LINE = re.compile(r"(0x[0-9a-f]+) (hostile_\w+)\+0x([0-9a-f]+)")


def instruction_at(elf: bytes, symbol: str, offset: int, size: int) -> bytes:
    """``size`` bytes of the ELF at ``symbol + offset`` (from .symtab)."""
    f = ELFFile(io.BytesIO(elf))
    sym = next(s for s in f.get_section_by_name(".symtab").iter_symbols()
               if s.name == symbol)
    vaddr = (sym["st_value"] & ~1) + offset
    for seg in f.iter_segments():
        if seg["p_type"] == "PT_LOAD" and \
                seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
            at = seg["p_offset"] + vaddr - seg["p_vaddr"]
            return elf[at:at + size]
    raise AssertionError(f"{symbol}+{offset:#x} is not in a loaded segment")


def check_report(text: str, case: str, arch: str, elf: bytes,
                 pc: int | None = None) -> None:
    """The report ``text`` names the system call of ``case`` on ``arch``,
    the function that made it (``hostile_<case>+0x...``), at the address
    of the system-call instruction (the bytes there in ``elf`` are that
    instruction; ``pc``, when known, is that address), and shows the
    instruction."""
    name, number = syscall_of(case, arch)
    names = {name} | OTHER_NAMES.get((case, arch), set())
    assert any(f"system call {n} ({number})" in text for n in names), text
    hit = _PC_LINE.search(text)
    assert hit is not None, f"no pc with the symbol hostile_{case}+0x... in:\n{text}"
    address, symbol, offset = int(hit[1], 16), hit[2], int(hit[3], 16)
    assert symbol == f"hostile_{case}", text
    if pc is not None:
        assert address == pc, (hex(address), hex(pc), text)
    mnemonic, encoding = INSTRUCTIONS[arch]
    assert instruction_at(elf, symbol, offset, len(encoding)) == encoding, \
        f"{symbol}+{offset:#x} is not the system-call instruction:\n{text}"
    lines = [line for line in text.splitlines() if "instruction:" in line]
    assert lines and mnemonic in lines[0], text
    assert "Traceback" not in text, text


def check_fault(err: BaseException, case: str, arch: str, elf: bytes) -> None:
    """``err`` is the 'syscall' fault of ``case`` on ``arch`` with its
    report."""
    name, number = syscall_of(case, arch)
    names = {name} | OTHER_NAMES.get((case, arch), set())
    assert isinstance(err, elfloader.EmulationError), repr(err)
    fault = err.fault
    assert fault is not None and fault.kind == "syscall", \
        f"fault {fault!r}, not 'syscall': {err}"
    assert fault.syscall == number, (fault.syscall, number, str(err))
    assert fault.syscall_name in names, (fault.syscall_name, str(err))
    assert isinstance(fault.pc, int)
    # (bit 0 of an arm32 pc marks Thumb code)
    check_report(str(err), case, arch, elf,
                 pc=fault.pc & ~1 if arch == "arm32" else fault.pc)


def _timed_out(err: BaseException) -> bool:
    from hal_cpu.errors import CallTimeoutError, DispatchTimeoutError
    return (isinstance(err, (CallTimeoutError, DispatchTimeoutError))
            or (isinstance(err, elfloader.EmulationError)
                and err.fault is not None and err.fault.kind == "timeout"))


#: qemu: the errno the guest may get instead of a fault, per case
#: (see the module docstring); the load status that stands for it.
QEMU_REFUSALS = {"mmap": (12, "RESOURCE_EXHAUSTED"),
                 "ptrace": (38, "UNIMPLEMENTED"),
                 "process_vm_readv": (38, "UNIMPLEMENTED")}


def check_outcome(err: BaseException | None, seconds: float, case: str,
                  arch: str, engine: str, elf: bytes, via: str) -> None:
    """The outcome of running ``case``: a 'syscall' fault (or, on qemu,
    what the module docstring lists), never a success. ``via``: "load"
    (plugin load: a refusal is a load status) or "dispatch" (the export
    or import returns the errno)."""
    where = f"{case} on {arch} ({engine}, {via})"
    assert err is not None, f"{where} succeeded: the system call reached the host"
    if case == "rt_sigaction":
        assert seconds < LOOP_LIMIT + LOOP_GRACE, \
            f"{where} took {seconds:.1f} s; the time limit is {LOOP_LIMIT} s"
        if engine == "qemu" and _timed_out(err):
            return
    if engine == "qemu" and case in QEMU_REFUSALS:
        from hal_cpu.errors import DispatchError, PluginStatusError
        errno, status = QEMU_REFUSALS[case]
        if isinstance(err, PluginStatusError):
            assert via == "load" and err.code_name == status, f"{where}: {err}"
            return
        if isinstance(err, DispatchError) and not isinstance(
                err, elfloader.EmulationError):
            assert via == "dispatch" and f" returned {errno} " in str(err), \
                f"{where}: {err}"
            return
    if engine == "qemu" and case == "clone":
        # qemu-user creates the guest's process with signals blocked: the
        # filter's trap ends the agent, and the call's number and pc die
        # with it. Still a 'syscall' fault that says what was refused.
        assert isinstance(err, elfloader.EmulationError), f"{where}: {err!r}"
        assert err.fault is not None and err.fault.kind == "syscall", \
            f"{where}: {err}"
        assert "creating a process" in str(err), f"{where}: {err}"
        return
    check_fault(err, case, arch, elf)


def attempt(fn) -> tuple[BaseException | None, float]:
    """(the typed error ``fn`` raised or None, seconds it took)."""
    start = time.monotonic()
    try:
        fn()
    except PortableKernelError as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def plugin_spec(path: Path, params: dict[str, str]) -> str:
    return f"{path}?{urlencode(params)}"


# --- the Python API ------------------------------------------------------------
@pytest.mark.parametrize("engine,arch", engine_arch_params())
def test_harmless_cases_run(hostile, host, engine, arch):
    """The plugin loads and the export runs when they make no system call:
    the failures below are the system calls'."""
    from hal_cpu import Executable
    from hal_cpu.plugins import PluginManager
    with PluginManager.from_specs([plugin_spec(hostile.plugin, {"syscall": "none"})],
                                  arch=arch, backend="emulated", timeout=LIMIT,
                                  engine=engine) as manager:
        assert manager.plugins[0].name == "hostile"
        with Executable(hostile.executable, arch=arch, backend="emulated",
                        plugins=manager, timeout=LIMIT) as exe:
            bindings = [path_binding(""), path_binding("")]
            exe.dispatch("hostile_dispatch", (1, 1, 1), bindings, [0, 0, 0, 0],
                         timeout=LIMIT)
    host.check()


@pytest.mark.parametrize("engine,arch,case", engine_arch_params(cases=list(CASES)))
def test_plugin_load_is_refused(hostile, host, engine, arch, case):
    """hostile.sos?syscall=CASE: the system call in the plugin's load."""
    from hal_cpu.plugins import PluginManager
    spec = plugin_spec(hostile.plugin, host.params(case))

    def load():
        with PluginManager.from_specs([spec], arch=arch, backend="emulated",
                                      timeout=limit_of(case), engine=engine):
            pass

    err, seconds = attempt(load)
    try:
        check_outcome(err, seconds, case, arch, engine,
                      hostile.elves[("plugin", arch)], "load")
    finally:
        host.check(f"{case} on {arch}, {engine}")


@pytest.mark.parametrize("engine,arch,case", engine_arch_params(cases=list(CASES)))
def test_dispatch_is_refused(hostile, host, engine, arch, case):
    """hostile_executable: the system call in the export's dispatch
    function."""
    from hal_cpu import Executable
    bindings, constants = host.dispatch_args(case)

    def run():
        with Executable(hostile.executable, arch=arch, backend="emulated",
                        engine=engine, timeout=LIMIT) as exe:
            exe.dispatch("hostile_dispatch", (1, 1, 1), bindings, constants,
                         timeout=limit_of(case))

    err, seconds = attempt(run)
    try:
        check_outcome(err, seconds, case, arch, engine,
                      hostile.elves[("executable", arch)], "dispatch")
        if (isinstance(err, elfloader.EmulationError)
                and err.fault is not None and err.fault.kind == "syscall"):
            assert "export hostile_dispatch" in str(err), str(err)
    finally:
        host.check(f"{case} on {arch}, {engine}")


@pytest.mark.parametrize("engine,arch,case", engine_arch_params(cases=CLI_CASES))
def test_import_called_by_a_dispatch_is_refused(hostile, host, engine, arch, case):
    """hostile.sos?syscall=CASE&when=call: the system call in the import
    hostile_syscall, called by the executable's export."""
    from hal_cpu import Executable
    from hal_cpu.plugins import PluginManager
    spec = plugin_spec(hostile.plugin, {**host.params(case), "when": "call"})
    bindings = [path_binding(""), path_binding("")]

    def run():
        with PluginManager.from_specs([spec], arch=arch, backend="emulated",
                                      timeout=LIMIT, engine=engine) as manager, \
                Executable(hostile.executable, arch=arch, plugins=manager,
                           timeout=LIMIT) as exe:
            exe.dispatch("hostile_dispatch", (1, 1, 1), bindings,
                         [CALL_IMPORT, 0, 0, 0], timeout=LIMIT)

    err, seconds = attempt(run)
    try:
        check_outcome(err, seconds, case, arch, engine,
                      hostile.elves[("plugin", arch)], "dispatch")
        text = str(err)
        assert "hostile.sos" in text, text
        assert "called from export hostile_dispatch" in text, text
    finally:
        host.check(f"{case} on {arch}, {engine}")


# --- the command line ----------------------------------------------------------
def hal_cpu(engine: str, cwd: Path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PKR_ENGINE=engine)
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def check_cli(proc: subprocess.CompletedProcess, case: str, arch: str,
              elf: bytes | None) -> None:
    """Exit status 1, no traceback, the first line of stderr the error
    naming the system call; with ``elf``, the report (function, pc,
    instruction) follows."""
    name, number = syscall_of(case, arch)
    text = proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, text)
    assert "Traceback" not in text, text
    first = text.splitlines()[0] if text else ""
    assert first.startswith("hal-cpu: error: "), text
    assert f"system call {name} ({number})" in first, text
    if elf is not None:
        check_report(text, case, arch, elf)


CLI_PARAMS = engine_arch_params(UNICORN_CLI_ARCHES, CLI_CASES)


def check_initializer(elf: bytes) -> None:
    """The loader sees the initializer of an ``-DHOSTILE_INIT`` build (its
    DT_INIT_ARRAY entry: on RELA architectures the file holds 0 there and
    the address is the addend of an R_*_RELATIVE relocation)."""
    image = elfloader.read_image(elf)
    assert image.initializers, (
        f"elfloader lists no initializer of the {image.arch.name} build, whose "
        "DT_INIT_ARRAY holds one: it would never run")


@pytest.mark.parametrize("engine,arch,case", CLI_PARAMS)
def test_cli_inspect(hostile, host, tmp_path, engine, arch, case):
    """hal-cpu inspect of a plugin whose initializer makes the system call
    (inspecting loads a plugin: its initializers run, emulated)."""
    marker = hostile.init_marker[("plugin", case)]
    host.extra_markers.append(marker)
    check_initializer(hostile.elves[(f"init_plugin:{case}", arch)])
    try:
        proc = hal_cpu(engine, tmp_path, "inspect", hostile.init_plugin[case],
                       f"--arch={arch}", "--timeout=30")
        check_cli(proc, case, arch, None)
    finally:
        host.check(f"{case} on {arch}, {engine}")


def _path_files(tmp_path: Path, bindings) -> list[str]:
    out = []
    for i, b in enumerate(bindings):
        path = tmp_path / f"binding{i}.bin"
        path.write_bytes(np.asarray(b).tobytes())
        out.append(f"--binding={np.asarray(b).size}xi8=@{path}")
    return out


def _run_args(arch: str, constants) -> list[str]:
    return [f"--arch={arch}", "--backend=emulated", "--function=hostile_dispatch",
            "--workgroup_count=1,1,1", "--print_bindings=none", "--timeout=60",
            *[f"--constant={c}" for c in constants]]


@pytest.mark.parametrize("engine,arch,case", CLI_PARAMS)
def test_cli_run_export(hostile, host, tmp_path, engine, arch, case):
    """hal-cpu run of the export, the case in its first push constant."""
    bindings, constants = host.dispatch_args(case)
    try:
        proc = hal_cpu(engine, tmp_path, "run", hostile.executable,
                       *_run_args(arch, constants), *_path_files(tmp_path, bindings))
        check_cli(proc, case, arch, hostile.elves[("executable", arch)])
    finally:
        host.check(f"{case} on {arch}, {engine}")


@pytest.mark.parametrize("engine,arch,case", CLI_PARAMS)
def test_cli_run_initializer(hostile, host, tmp_path, engine, arch, case):
    """hal-cpu run of an executable whose initializer makes the system
    call: it stops while loading."""
    marker = hostile.init_marker[("executable", case)]
    host.extra_markers.append(marker)
    check_initializer(hostile.elves[(f"init_executable:{case}", arch)])
    bindings = [path_binding(""), path_binding("")]
    try:
        proc = hal_cpu(engine, tmp_path, "run", hostile.init_executable[case],
                       *_run_args(arch, [0, 0, 0, 0]), *_path_files(tmp_path, bindings))
        check_cli(proc, case, arch, hostile.elves[(f"init_executable:{case}", arch)])
    finally:
        host.check(f"{case} on {arch}, {engine}")


@pytest.mark.parametrize("engine,arch,case", CLI_PARAMS)
def test_cli_run_with_the_plugin(hostile, host, tmp_path, engine, arch, case):
    """hal-cpu run --executable_plugin=hostile.sos?syscall=CASE&...: the
    plugin's load makes the system call."""
    bindings = [path_binding(""), path_binding("")]
    try:
        proc = hal_cpu(engine, tmp_path, "run", hostile.executable,
                       f"--executable_plugin={plugin_spec(hostile.plugin, host.params(case))}",
                       *_run_args(arch, [0, 0, 0, 0]), *_path_files(tmp_path, bindings))
        check_cli(proc, case, arch, hostile.elves[("plugin", arch)])
    finally:
        host.check(f"{case} on {arch}, {engine}")


@pytest.mark.parametrize("engine,arch,case", CLI_PARAMS)
def test_cli_run_module(hostile, host, compile_cache, tmp_path, engine, arch, case):
    """hal-cpu run-module of sample_plugins/standalone_example.mlir, whose
    dispatch calls the import simple_mul_workgroup: hostile.sos
    (when=call) provides it and makes the system call there."""
    pytest.importorskip("iree.compiler")
    spec = plugin_spec(hostile.plugin, {**host.params(case), "when": "call"})
    try:
        proc = hal_cpu(engine, tmp_path, "run-module",
                       ROOT / "sample_plugins" / "standalone_example.mlir",
                       "--function=mixed_invocation", "--input=8xf32=2",
                       "--input=8xf32=4", f"--arch={arch}", "--backend=emulated",
                       f"--cache_dir={compile_cache}", "--timeout=60",
                       f"--executable_plugin={spec}")
        check_cli(proc, case, arch, hostile.elves[("plugin", arch)])
        first = proc.stderr.splitlines()[0]
        assert "hostile.sos" in first and "called from export mul" in first, \
            proc.stderr
    finally:
        host.check(f"{case} on {arch}, {engine}")


# --- the pytest fixtures -------------------------------------------------------
INNER_TESTS = '''
import numpy as np
from urllib.parse import urlencode
from fatelf.cstruct import CStruct

PLUGIN = {plugin!r}
EXECUTABLE = {executable!r}
DIRECTORY = {directory!r}
CASES = {cases!r}
PARAMS = CStruct("unused_t", [("unused", "u32")])


def marker(hal_arch, test):
    return f"{{DIRECTORY}}/{{test}}-{{hal_arch}}"


def spec(params):
    return PLUGIN + "?" + urlencode(params)


def test_load_openat(hal_plugin, hal_arch):
    hal_plugin(spec(dict(syscall="openat", path=marker(hal_arch, "load_openat"))))


def test_load_execve(hal_plugin, hal_arch):
    hal_plugin(spec(dict(syscall="execve", path=marker(hal_arch, "load_execve"))))


def test_call_openat(hal_plugin, hal_arch):
    plugin = hal_plugin(spec(dict(syscall="openat", when="call",
                                  path=marker(hal_arch, "call_openat"))))
    plugin.call("hostile_syscall", PARAMS, dict(unused=0))


def test_dispatch_execve(hal_executable, hal_arch):
    path = marker(hal_arch, "dispatch_execve").encode()
    first = np.zeros(512, np.uint8)
    first[:len(path)] = np.frombuffer(path, np.uint8)
    exe = hal_executable(EXECUTABLE)
    exe.dispatch("hostile_dispatch", (1, 1, 1), [first, np.zeros(512, np.uint8)],
                 [CASES["execve"], 0, 0, 0])
'''

#: inner test -> (case, the ELF: "plugin" or "executable")
INNER = {"test_load_openat": ("openat", "plugin"),
         "test_load_execve": ("execve", "plugin"),
         "test_call_openat": ("openat", "plugin"),
         "test_dispatch_execve": ("execve", "executable")}


@pytest.mark.parametrize("engine", [pytest.param("qemu", marks=QEMU), "unicorn"])
def test_pytest_fixtures(hostile, host, tmp_path, engine):
    """The plugin fixtures (hal_plugin, hal_executable) in an inner pytest
    session: each system call fails its test with the fault report."""
    archs = ARCHES if engine == "qemu" else UNICORN_CLI_ARCHES
    markers = host.directory / "inner"
    markers.mkdir()
    tests = tmp_path / "test_hostile_inner.py"
    tests.write_text(INNER_TESTS.format(plugin=str(hostile.plugin),
                                        executable=str(hostile.executable),
                                        directory=str(markers), cases=CASES))
    xml = tmp_path / "out.xml"
    env = dict(os.environ, PKR_ENGINE=engine, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                       if p]))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
             "-p", "no:xdist", f"--junitxml={xml}", "--rootdir", str(tmp_path),
             f"--hal-arch={','.join(archs)}", "--hal-timeout=30", str(tests)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, output
        results = {}
        for testcase in ET.parse(xml).iter("testcase"):
            failure = testcase.find("failure")
            if failure is None:
                failure = testcase.find("error")
            results[testcase.get("name")] = (
                "passed" if failure is None else "failed",
                "" if failure is None else (failure.text or failure.get("message", "")))
        assert len(results) == len(INNER) * len(archs), output
        problems = []
        for arch in archs:
            for test, (case, kind) in INNER.items():
                outcome, text = results[f"{test}[{arch}]"]
                try:
                    assert outcome == "failed", f"{test}[{arch}] passed"
                    first = text.splitlines()[0] if text else ""
                    assert first.startswith("EmulationError: "), text
                    check_report(text, case, arch, hostile.elves[(kind, arch)])
                    if test == "test_call_openat":
                        assert "import hostile_syscall" in text, text
                    if test == "test_dispatch_execve":
                        assert "export hostile_dispatch" in text, text
                except AssertionError as exc:
                    problems.append(f"{test}[{arch}]: {exc}")
        assert not problems, "\n\n".join(problems)
    finally:
        host.extra_markers += list(markers.iterdir())
        host.check(f"fixtures, {engine}")
