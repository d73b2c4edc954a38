"""Finding and running ``iree-compile``.

``compile_program`` compiles one MLIR program for one architecture with the
``llvm-cpu`` backend of IREE's local device and keeps three outputs: the
``.vmfb`` module, the embedded-ELF HAL executables that the module carries
(dumped with ``--iree-hal-dump-executable-binaries-to``) and the HAL-level IR
of the host program (``--compile-to=hal``), for reading.

Only one compiler version is supported: :data:`SUPPORTED_VERSION` from the
``iree-base-compiler`` package (``pip install
'portable-kernel-runtime[iree]'``). Target flags come from the architecture
table, ``fatelf.arches.lookup(arch).iree_flags``.

For 32-bit x86 and Arm (:data:`hal_cpu.runtime.LIBM_ARCHES`) the compiler
links through :data:`hal_cpu.runtime.LIBM_LINKER` (``iree-lld`` plus
``hal_cpu/runtime/libm.c``): the musl bitcode iree-compile 3.13 links into
32-bit executables has ``fmaf``, ``floor`` and ``round`` with no body and
lacks ``fmaxf``, ``fminf`` and others, so without it ``exp``, ``tanh``,
``sin``... run past the end of the code and softmax does not link
(:func:`libm_linker_flags`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

from fatelf import arches, private_dirs

from .errors import CompileError, IreeToolError

__all__ = [
    "SUPPORTED_VERSION", "INSTALL_HINT", "BASE_FLAGS", "Compiled",
    "target_flags", "variant_name", "find_iree_compile", "iree_compile_version",
    "default_cache_dir", "compile_program", "compile_many", "libm_linker_flags",
    "release_of",
]

PathLike = Union[str, os.PathLike]

#: The ``iree-base-compiler`` / ``iree-base-runtime`` release this package
#: works with. Builds of it report e.g. ``3.13.0rc20261016``; the release part
#: must match.
SUPPORTED_VERSION = "3.13.0"

#: How to install the supported IREE tools.
INSTALL_HINT = "pip install 'portable-kernel-runtime[iree]'"

#: Flags common to every compile: IREE's local device with the llvm-cpu
#: backend (embedded-ELF executables).
BASE_FLAGS: tuple[str, ...] = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)

_VERSION_RE = re.compile(r"compiler version\s+(\S+)")


def release_of(version: str) -> str | None:
    """The ``X.Y.Z`` release a version string starts with (``3.4.0`` of
    ``3.4.0rc20250101``), or None."""
    m = re.match(r"(\d+\.\d+\.\d+)(?!\d)", version)
    return m.group(1) if m else None


def target_flags(arch: str, cpu: str | None = None) -> tuple[str, ...]:
    """``iree-compile`` flags selecting ``arch`` (name or alias, e.g.
    ``arm64``): :data:`BASE_FLAGS` plus the table's ``iree_flags``, or the
    flags of CPU profile ``cpu`` (e.g. ``x86-64-v3``, ``sve``, ``rv64gcv``;
    :data:`fatelf.arches.PROFILES`).

    Raises:
        fatelf.FatElfSelectError: unknown architecture or profile, or an
            architecture the runtime does not run.
    """
    info = arches.lookup(arch, runtime=True)
    if cpu:
        return BASE_FLAGS + arches.profile(info.name, cpu).iree_flags
    return BASE_FLAGS + info.iree_flags


def variant_name(arch: str) -> str:
    """Name IREE gives the executable variant for ``arch``, e.g.
    ``embedded_elf_arm_64`` for ``aarch64``; also the suffix of the dumped
    ``<module>_<executable>_<variant>.so`` files."""
    return "embedded_elf_" + arches.lookup(arch, runtime=True).iree_variant


def _which() -> str | None:
    exe = shutil.which("iree-compile")
    if exe:
        return exe
    # the interpreter's own scripts directory (a virtualenv not on PATH)
    scripts = sysconfig.get_path("scripts")
    for name in ("iree-compile", "iree-compile.exe"):
        cand = Path(scripts) / name if scripts else None
        if cand is not None and cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


@functools.lru_cache(maxsize=None)
def _version_text(exe: str, mtime_ns: int) -> str:
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IreeToolError(f"cannot run it ({e}); {SUPPORTED_VERSION} is needed: "
                            f"{INSTALL_HINT}", name=exe, field="version") from None
    return (proc.stdout + proc.stderr).strip()


def _checked(exe: str) -> tuple[str, str]:
    """(version, full ``--version`` text) of ``exe``, checked."""
    text = _version_text(exe, os.stat(exe).st_mtime_ns)
    m = _VERSION_RE.search(text)
    version = m.group(1) if m else None
    if version is None or release_of(version) != SUPPORTED_VERSION:
        found = f"found {version}" if version else "no version in its --version output"
        raise IreeToolError(
            f"{found}; iree-compile {SUPPORTED_VERSION} (iree-base-compiler=="
            f"{SUPPORTED_VERSION}) is needed: {INSTALL_HINT}",
            name=exe, field="version", value=version)
    return version, text


def find_iree_compile() -> Path:
    """Path of the supported ``iree-compile``.

    Looks on ``PATH``, then in the running interpreter's scripts directory,
    and checks ``iree-compile --version`` (cached per file and mtime).

    Raises:
        IreeToolError: not found, cannot run, or a version other than
            :data:`SUPPORTED_VERSION`; the one-line message says which version
            is needed and how to install it.
    """
    exe = _which()
    if exe is None:
        raise IreeToolError(
            f"not found on PATH; iree-compile {SUPPORTED_VERSION} (iree-base-compiler=="
            f"{SUPPORTED_VERSION}) is needed: {INSTALL_HINT}", name="iree-compile")
    _checked(exe)
    return Path(exe)


def iree_compile_version() -> str:
    """Version of the ``iree-compile`` in use, e.g. ``3.13.0rc20261016``.

    Raises:
        IreeToolError: as :func:`find_iree_compile`.
    """
    return _checked(str(find_iree_compile()))[0]


def default_cache_dir() -> Path:
    """Where :func:`compile_program` keeps outputs when given no directory:
    ``<user cache dir>/iree-compile``, the user cache dir being
    ``platformdirs.user_cache_dir("portable-kernel-runtime")``."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("portable-kernel-runtime")) / "iree-compile"


#: The flag naming the linker iree-compile runs for embedded ELFs.
LINKER_FLAG = "--iree-llvmcpu-embedded-linker-path"

#: Characters a linker path may hold: iree-compile runs the linker through
#: the shell with the path unquoted.
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./+@%,:=-]+")


def _iree_lld() -> Path | None:
    """The ``iree-lld`` iree-compile runs: the ``iree-base-compiler``
    package's, else one on ``PATH``; None when there is none."""
    spec = importlib.util.find_spec("iree.compiler")
    candidates = []
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "_mlir_libs" / "iree-lld")
    found = shutil.which("iree-lld")
    if found:
        candidates.append(Path(found))
    for lld in candidates:
        if lld.is_file() and os.access(lld, os.X_OK):
            return lld
    return None


#: Folder of the linker launchers in the shared temporary folder, under
#: :func:`fatelf.private_dirs.temp_root`; used only when neither the cache
#: directory given nor :func:`default_cache_dir` is safe to hand to a shell.
TEMP_LAUNCHER_FOLDER = "iree-compile"


def _cache_root(out_dir: PathLike | None) -> Path:
    """The cache directory ``out_dir``, created and checked: a directory of
    this user that group and others cannot write (when given), or the
    private :func:`default_cache_dir` (``0700``, created so).

    Raises:
        IreeToolError: the folder is a symlink, someone else's or writable
            by others (``field`` ``cache_dir.<what>``).
        OSError: it cannot be created.
    """
    if out_dir is None:
        default = default_cache_dir()
        return private_dirs.private_dir(default, IreeToolError, root=default.parent,
                                        field="cache_dir")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    private_dirs.check_private_dir(folder.resolve(), IreeToolError, field="cache_dir",
                                   readable=True)
    return folder


def _launcher_root(tool_dir: PathLike | None) -> Path:
    """The checked folder the linker launchers live in: the first of
    ``tool_dir`` (when given), :func:`default_cache_dir` and
    ``<temp>/portable-kernel-runtime-<uid>/iree-compile`` whose absolute
    path a shell takes unquoted.

    Raises:
        IreeToolError: that folder fails :func:`_cache_root`'s or
            :func:`fatelf.private_dirs.private_dir`'s checks, or no
            candidate's path is shell-safe (``field`` ``cache_dir``).
    """
    tried = []
    for given in ([tool_dir] if tool_dir is not None else []) + [None]:
        path = Path(given) if given is not None else default_cache_dir()
        if _SHELL_SAFE.fullmatch(str(path.resolve())):
            try:
                return _cache_root(given).resolve()
            except OSError:
                if given is not None:
                    raise
                continue    # no writable cache home: the temporary folder
        tried.append(str(path.resolve()))
    root = private_dirs.temp_root()
    folder = root / TEMP_LAUNCHER_FOLDER
    if not _SHELL_SAFE.fullmatch(str(folder.resolve())):
        tried.append(str(folder.resolve()))
        raise IreeToolError(
            "no folder for the linker launcher has a path iree-compile can pass "
            "to the shell unquoted (letters, digits and _./+@%,:=- only); "
            "set --cache_dir or XDG_CACHE_HOME to such a path",
            name=tried[0], field="cache_dir", value=tried)
    return private_dirs.private_dir(folder, IreeToolError, root=root,
                                    field="cache_dir").resolve()


def _check_launcher(folder: Path, files: dict[str, bytes]) -> None:
    """Check a launcher folder before iree-compile runs it: the folder and
    each file pass :mod:`fatelf.private_dirs`'s checks (this user's, not a
    symlink, not writable by others; the folder private) and each file holds
    exactly ``files[name]``.

    Raises:
        IreeToolError: a check failed (``field`` names the file and what).
    """
    private_dirs.check_private_dir(folder, IreeToolError, field="linker folder")
    for name, data in files.items():
        path = folder / name
        private_dirs.check_private_file(path, IreeToolError, field=f"linker {name}")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            found = f.read(len(data) + 1)
        if found != data:
            raise IreeToolError(
                "the file differs from what this runtime writes there; remove "
                "the folder and run again", name=str(path),
                field=f"linker {name}.content", value=len(found))


def libm_linker_flags(arch: str, tool_dir: PathLike | None = None,
                      cpu: str | None = None) -> tuple[tuple[str, ...], str]:
    """The ``iree-compile`` flag that links ``arch``'s executables through
    :data:`hal_cpu.runtime.LIBM_LINKER`, and a digest of what it runs.

    iree-compile 3.13 links musl's math functions into every embedded ELF
    as bitcode; for 32-bit targets that bitcode (built for wasm32) defines
    ``fmaf``, ``floor`` and ``round`` with no body (calls to them run
    whatever follows) and lacks ``fmaxf``, ``fminf``, ``truncf``... (the
    link fails). The linker sends those calls to ``hal_cpu/runtime/libm.c``
    instead (:mod:`hal_cpu.buildtools.libm_link`), and for CPU profile ``cpu``
    (None: the architecture's default) the calls of
    :data:`hal_cpu.runtime.LIBM_REDIRECTS` too.

    Writes, once, the architecture's libm object and a launcher script
    into a folder ``.libm-link-<arch>-<digest>`` (``0700``, the files written
    fresh with ``O_EXCL``), named by the digest of the object, the linker
    script, the Python interpreter and ``iree-lld``, in the first of
    ``tool_dir``, :func:`default_cache_dir` (``0700``) and
    ``<temp>/portable-kernel-runtime-<uid>/iree-compile`` (``0700``) whose
    path is safe to hand to a shell unquoted, as iree-compile does. Each of
    those folders, the launcher's folder and its files are checked before
    use (:mod:`fatelf.private_dirs`: this user's, not a symlink, not
    writable by others, the files holding exactly what is written there).

    Returns:
        ``((flag,), digest)``, or ``((), "")`` for architectures whose
        executables need none or when ``iree-lld`` cannot be found.

    Raises:
        IreeToolError: a folder or file on the way fails those checks
            (someone else's, a symlink, writable by others, changed), or no
            candidate folder's path is shell-safe.
    """
    import fatelf

    from .. import runtime

    info = arches.lookup(arch, runtime=True)
    lld = _iree_lld()
    if info.name not in runtime.LIBM_ARCHES or lld is None:
        return (), ""
    obj = fatelf.select(runtime.LIBM_BUNDLE.read_bytes(), info.name,
                        name=str(runtime.LIBM_BUNDLE))
    profile = arches.profile(info.name, cpu or arches.DEFAULT_PROFILES[info.name])
    redirects = [f"--redirect={name}={target}" for name, target in sorted(
        runtime.LIBM_REDIRECTS.get((info.name, profile.name), {}).items())]
    python = sys.executable
    # Everything the launcher holds goes into its folder's name (the
    # linker script's path too: two checkouts of this runtime write
    # launchers of different text, each in a folder of its own).
    digest = hashlib.sha256(b"\0".join([
        obj, runtime.LIBM_LINKER.read_bytes(), str(runtime.LIBM_LINKER).encode(),
        python.encode(), str(lld).encode(),
        *(r.encode() for r in redirects)])).hexdigest()[:16]
    folder = _launcher_root(tool_dir) / f".libm-link-{info.name}-{digest}"
    launcher = folder / "iree-lld"
    args = [python, str(runtime.LIBM_LINKER), str(lld), str(folder / "libm.o"),
            *redirects]
    script = ("#!/bin/sh\n# iree-lld with hal_cpu's libm (hal_cpu/buildtools/libm_link.py)\n"
              f"exec {' '.join(shlex.quote(a) for a in args)} \"$@\"\n").encode()
    files = {"libm.o": obj, "iree-lld": script}
    if not os.path.lexists(folder):
        # written fresh into a new private folder (mkdtemp: 0700), then
        # renamed into place whole
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            for name, data in files.items():
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_NOFOLLOW", 0), 0o700)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            try:
                os.replace(tmp, folder)
            except OSError:
                if not os.path.lexists(folder):   # another process won the race
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    _check_launcher(folder, files)
    return (f"{LINKER_FLAG}={launcher}",), digest


@dataclass(frozen=True)
class Compiled:
    """Outputs of :func:`compile_program` for one (program, architecture).

    Attributes:
        source: the MLIR file compiled (absolute).
        arch: canonical architecture name (``x86_64``, ``aarch64``...).
        vmfb: the IREE VM module.
        hal_mlir: the HAL-level IR of the same compile.
        so_files: every embedded ELF the compiler dumped (one per
            ``hal.executable``; none for a program without dispatches), sorted.
        functions: public function names of the module, in order of appearance.
    """

    source: Path
    arch: str
    vmfb: Path
    hal_mlir: Path
    so_files: tuple[Path, ...]
    functions: tuple[str, ...]

    @property
    def function(self) -> str:
        """The single public function.

        Raises:
            ValueError: the module has none or several.
        """
        if len(self.functions) != 1:
            raise ValueError(f"{self.source.name} has public functions "
                             f"{list(self.functions)}; name one")
        return self.functions[0]

    @property
    def variant(self) -> str:
        """The executable variant name for :attr:`arch`, e.g.
        ``embedded_elf_x86_64``."""
        return variant_name(self.arch)

    def so_for(self, executable: str, variant: str | None = None) -> Path:
        """The dumped ``.so`` of ``hal.executable @executable`` (variant
        ``@variant``, default :attr:`variant`).

        ``iree-compile`` names dumps ``<module>_<executable>_<variant>.so``,
        <module> being the MLIR module name (``module`` when unnamed).

        Raises:
            FileNotFoundError: no single dumped file matches.
        """
        variant = variant or self.variant
        exact = f"module_{executable}_{variant}.so"
        for p in self.so_files:
            if p.name == exact:
                return p
        hits = [p for p in self.so_files if p.name.endswith(f"_{executable}_{variant}.so")]
        if len(hits) != 1:
            raise FileNotFoundError(
                f"no unique dumped binary for executable {executable!r} variant "
                f"{variant!r} among {[p.name for p in self.so_files]}")
        return hits[0]


#: Seconds one ``iree-compile`` run may take by default (it is killed past
#: them; some inputs make it loop, e.g. a recursive host function).
COMPILE_TIMEOUT = 600.0


def _run_compile(args: list[str], timeout: float | None = None) -> None:
    import signal
    limit = COMPILE_TIMEOUT if timeout is None else timeout
    try:
        # its own process group: the launcher script starts the compiler
        # binary, and both end when either the limit or this process does
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
    except OSError as e:
        raise IreeToolError(f"cannot run it ({e})", name=args[0]) from None
    try:
        _, stderr = child.communicate(timeout=limit)
    except BaseException as exc:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise CompileError(f"iree-compile did not finish within {limit:g} s "
                               "(stopped)", name=args[1], field="iree-compile",
                               value=limit) from None
        raise
    proc = subprocess.CompletedProcess(args, child.returncode, "", stderr)
    if proc.returncode != 0:
        raise CompileError(f"iree-compile failed ({proc.returncode}):\n"
                           f"$ {' '.join(args)}\n{proc.stderr}",
                           name=args[1], value=proc.returncode)


def _public_functions(hal_text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"^\s*util\.func public @([\w$.-]+)\(", hal_text, re.M))


def compile_program(mlir_path: PathLike, arch: str, out_dir: PathLike | None = None,
                    *, extra_flags: Sequence[str] = (),
                    cpu: str | None = None,
                    timeout: float | None = None) -> Compiled:
    """Compile an MLIR program for ``arch`` (name or alias), cached.

    Writes ``<stem>.vmfb``, ``binaries/*.so`` (the embedded ELFs) and
    ``<stem>.hal.mlir`` (the host-side IR as ``--compile-to=hal`` prints it,
    taken from the same run's ``--dump-compilation-phases-to`` output, or from
    a second ``--compile-to=hal`` run when that phase is missing) into one
    directory:

    ``<out_dir>/<stem>-<arch>[-<cpu>]-<hash>/``, ``out_dir`` defaulting
    to :func:`default_cache_dir` (created ``0700``). ``out_dir`` must be a
    directory of this user that group and others cannot write, not a
    symlink to someone else's (checked). ``<hash>`` starts the key: a SHA-256 of
    the source text and path (the IR's locations name the file), the flags
    and the compiler's ``--version`` output, kept in the directory's
    ``stamp.txt``; a directory whose stamp matches is reused without
    running the compiler. Programs of one name in different directories,
    or one program before and after an edit, get directories of their own.

    Args:
        mlir_path: the MLIR source (any input ``iree-compile`` accepts).
        arch: target architecture, e.g. ``x86_64``, ``arm64``, ``rv32``.
        out_dir: cache directory; created if needed.
        extra_flags: more ``iree-compile`` flags (part of the hash).
        cpu: CPU profile to compile for (:func:`target_flags`); None: the
            architecture's default profile.
        timeout: seconds each ``iree-compile`` run may take (default
            :data:`COMPILE_TIMEOUT`); it is killed past them.

    Raises:
        IreeToolError: ``iree-compile`` missing or not :data:`SUPPORTED_VERSION`.
        CompileError: the compiler reported an error (message has its stderr).
        fatelf.FatElfSelectError: unknown architecture.
        IreeToolError: also when ``out_dir`` (or a folder of the 32-bit
            linker) is someone else's, a symlink or writable by others.
        OSError: the source cannot be read or the directory written.
    """
    info = arches.lookup(arch, runtime=True)
    arch = info.name
    mlir_path = Path(mlir_path).resolve()
    # locations in the HAL-level IR point the interpreter's errors at the
    # user's source
    flags = (list(target_flags(arch, cpu)) + ["--mlir-print-debuginfo"]
             + list(extra_flags))
    exe = str(find_iree_compile())
    _, version_text = _checked(exe)
    # our libm for 32-bit targets (unless the caller picks a linker); the
    # key holds its digest rather than the launcher's path
    link_flags, link_digest = ((), "") if any(
        f.startswith(LINKER_FLAG) for f in extra_flags) else libm_linker_flags(arch, out_dir, cpu)
    # the path is part of the key: the IR's locations name the source file
    key = hashlib.sha256("\0".join(
        [mlir_path.read_text(), str(mlir_path), *flags, version_text]
        + ([f"libm:{link_digest}"] if link_digest else [])).encode()).hexdigest()
    flags += link_flags
    # named by the key in any directory: two programs of one name (in
    # different directories, or one edited) never share a directory
    out_dir = _cache_root(out_dir)
    dest = out_dir / (f"{mlir_path.stem}-{arch}"
                      + (f"-{cpu.lower()}" if cpu else "") + f"-{key[:16]}")
    stamp = dest / "stamp.txt"
    vmfb = dest / f"{mlir_path.stem}.vmfb"
    hal = dest / f"{mlir_path.stem}.hal.mlir"
    dump = dest / "binaries"

    if not (stamp.is_file() and stamp.read_text() == key and vmfb.is_file()
            and hal.is_file()):
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=out_dir))
        try:
            tdump = tmp / "binaries"
            tdump.mkdir()
            phases = tmp / "phases"
            # One run gives the vmfb, the dumped ELFs and (as a compilation
            # phase) the HAL-level IR of that very compile.
            _run_compile([exe, str(mlir_path), "-o", str(tmp / vmfb.name), *flags,
                          f"--iree-hal-dump-executable-binaries-to={tdump}",
                          f"--dump-compilation-phases-to={phases}"], timeout)
            hal_phase = sorted(phases.glob("*.hal.mlir"))
            if len(hal_phase) == 1:
                os.replace(hal_phase[0], tmp / hal.name)
            else:
                _run_compile([exe, str(mlir_path), "--compile-to=hal",
                              "-o", str(tmp / hal.name), *flags], timeout)
            shutil.rmtree(phases, ignore_errors=True)
            (tmp / "stamp.txt").write_text(key)
            if dest.exists():
                shutil.rmtree(dest)
            try:
                os.replace(tmp, dest)
            except OSError:
                # another process won the race; use its result
                if not (dest / "stamp.txt").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    so_files = tuple(sorted(dump.glob("*.so")))
    return Compiled(source=mlir_path, arch=arch, vmfb=vmfb, hal_mlir=hal,
                    so_files=so_files, functions=_public_functions(hal.read_text()))


def compile_many(jobs: Iterable[tuple[PathLike, str]], out_dir: PathLike | None = None,
                 *, max_workers: int | None = None,
                 extra_flags: Sequence[str] = ()) -> list[Compiled]:
    """:func:`compile_program` for several ``(mlir_path, arch)`` pairs, run in
    parallel threads (default: one per CPU); results in job order.

    Raises:
        The first error of :func:`compile_program` among the jobs.
    """
    from concurrent.futures import ThreadPoolExecutor

    jobs = list(jobs)
    with ThreadPoolExecutor(max_workers or os.cpu_count() or 2) as pool:
        return list(pool.map(lambda j: compile_program(j[0], j[1], out_dir,
                                                       extra_flags=extra_flags), jobs))
