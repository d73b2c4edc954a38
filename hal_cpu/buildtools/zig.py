"""Build self-contained freestanding shared objects with zig's clang and lld.

The project's own machine code (the sample plugins, the runtime support
library in :mod:`hal_cpu.runtime`) is C compiled by ``python -m ziglang cc``
(PyPI package ``ziglang``, pinned to :data:`ZIG_VERSION`) for a
freestanding target and linked by its ``ld.lld`` into an ET_DYN with no
libc, no ``DT_NEEDED``, no undefined symbols and only RELATIVE relocations:
what :mod:`elfloader` loads on every backend.

Target flags come from the architecture table (:mod:`fatelf.arches`,
``ArchInfo.zig_flags``), or from a CPU profile of it. The build is
reproducible: one ziglang version gives the same bytes on every run and in
any output directory, because sources are compiled from their own directory
by relative name, without debug info or build ids.

A plugin for every architecture, packed as a FatELF ``.sos`` (what
``hal-cpu build-plugin`` does)::

    from hal_cpu.buildtools import zig as zigbuild
    data = zigbuild.build_plugin(["my_plugin.c"], arches="all", debug=True)
    open("my_plugin.sos", "wb").write(data)

Vector builds: a CPU profile per architecture (``cpu="x86_64:x86-64-v3,
aarch64:sve,riscv64:rv64gcv"``, or a mapping), or several per architecture
(``cpu={"aarch64": ["armv8-a", "sve"]}``): each profile is a record of its
own, the first of an architecture the one every loader picks by default
(IREE's too), the others told apart by their ``EI_ABIVERSION`` and picked
by profile (:func:`select_profile`, :func:`profile_image`)::

    data = zigbuild.build_plugin(["my_plugin.c"], "all",
                                 cpu="aarch64:armv8-a,aarch64:sve")
    zigbuild.bundle_profiles(data)   # [..., ('aarch64', 'armv8-a'), ('aarch64', 'sve'), ...]

One object for one architecture::

    data = zigbuild.build_freestanding("loop.c", "riscv32", cwd=src_dir,
                                       work_dir=tmp, exports=["my_fn"])

Plugins include ``plugin_abi.h``, or IREE's own header name
``iree/hal/local/executable_plugin.h`` (as IREE's sample plugins do), from
:func:`hal_cpu.get_include`, which both functions put on the include path.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from fatelf import arches, private_dirs
from fatelf.arches import ArchInfo

from ..errors import HalCpuError

#: The ziglang release the committed binaries were produced with; another
#: release builds working objects with different bytes.
ZIG_VERSION = "0.17.0"

#: Compiler flags of every freestanding object, after the target flags.
CFLAGS: tuple[str, ...] = (
    "-std=c17",
    "-fPIC",
    "-ffreestanding",
    "-fvisibility=hidden",
    "-fdata-sections",
    "-ffunction-sections",
    # No .eh_frame / .ARM.exidx: their personality references would leave
    # __aeabi_unwind_cpp_pr* undefined on arm.
    "-fno-unwind-tables",
    "-fno-asynchronous-unwind-tables",
    "-fno-stack-protector",
    # zig's clang turns UBSan on by default in some modes (a debug build):
    # its checks call the UBSan runtime, which a freestanding object does
    # not link, so neither ld.lld nor iree-lld could resolve them.
    "-fno-sanitize=undefined",
    "-g0",
    "-O2",
    "-Wall",
    "-Werror",
)

#: ``ld.lld`` flags: a static, self-contained, stripped shared object
#: (:data:`DEBUG_LINK_FLAGS` for ``debug=True`` builds).
LINK_FLAGS: tuple[str, ...] = (
    "--build-id=none",
    "-nostdlib",
    "-static",
    "-shared",
    "--no-undefined",
    "--gc-sections",
    "-z", "now",
    "-z", "relro",
    "--discard-all",
    "--strip-debug",
    "--hash-style=sysv",
)

#: Compiler flags replaced in ``debug=True`` builds: DWARF line tables and
#: subprograms for fault reports (``file:line``).
DEBUG_CFLAGS = {"-g0": "-g"}

#: ``ld.lld`` flags of ``debug=True`` builds: :data:`LINK_FLAGS` keeping
#: local symbols in ``.symtab`` and the DWARF sections (no
#: ``--discard-all``, no ``--strip-debug``), so reports name static
#: functions and source lines.
DEBUG_LINK_FLAGS: tuple[str, ...] = tuple(
    f for f in LINK_FLAGS if f not in ("--discard-all", "--strip-debug"))

#: The entry point every plugin exports.
PLUGIN_QUERY = "iree_hal_executable_plugin_query"

#: The folder of :func:`cache_dir` in the runtime's private cache
#: (:func:`fatelf.private_dirs.cache_folder`).
CACHE_FOLDER = "zig"


class ZigBuildError(HalCpuError):
    """ziglang is missing, a compile or link command failed, or an output is
    not a self-contained object (``field`` names what was checked)."""


def zig_available() -> bool:
    """True when the ``ziglang`` package can be imported."""
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return False
    return True


def zig_version() -> str | None:
    """Installed ``ziglang`` version, or None when it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("ziglang")
    except PackageNotFoundError:
        return None


def version_warning() -> str | None:
    """A message when the installed ziglang is not :data:`ZIG_VERSION`."""
    found = zig_version()
    if found and found != ZIG_VERSION:
        return (f"ziglang {found} differs from {ZIG_VERSION}; outputs will not "
                "match the committed binaries")
    return None


def warn_if_other_version() -> None:
    """Print :func:`version_warning` to stderr, if any."""
    warning = version_warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def require_zig() -> None:
    """Raises:
        ZigBuildError: the ``ziglang`` package is not installed."""
    if not zig_available():
        raise ZigBuildError(f"the `ziglang` package is required: pip install "
                            f"ziglang=={ZIG_VERSION}", field="ziglang")


def cache_dir() -> Path:
    """zig's global cache, ``ZIG_GLOBAL_CACHE_DIR`` of every build command
    unless the environment sets it: ``<cache home>/portable-kernel-runtime/zig``
    (``$XDG_CACHE_HOME`` or ``~/.cache``), or, without a writable cache
    home, ``<temp>/portable-kernel-runtime-<uid>/zig``; created ``0700`` and
    checked each time (:func:`fatelf.private_dirs.cache_folder`), since what
    zig finds there goes into the objects it builds.

    Raises:
        ZigBuildError: a folder on the way is a symlink, someone else's or
            writable by others (``field`` ``cache.<what>``), or none can be
            created (``field`` ``ZIG_GLOBAL_CACHE_DIR``).
    """
    try:
        return private_dirs.cache_folder(CACHE_FOLDER, ZigBuildError)
    except OSError as exc:
        raise ZigBuildError(f"cannot create zig's cache folder: {exc.strerror or exc}",
                            name=exc.filename, field="ZIG_GLOBAL_CACHE_DIR",
                            value=exc.filename) from None


def zig_command() -> list[str]:
    """``[python, -m, ziglang]``: prefix of ``cc`` and ``ld.lld`` commands."""
    return [sys.executable, "-m", "ziglang"]


def run(cmd: Sequence[str], cwd: Path | str) -> None:
    """Run a build command in ``cwd``.

    Raises:
        ZigBuildError: non-zero exit (the message holds its output), the
            program could not be started, or zig's cache folder fails its
            checks (:func:`cache_dir`).
    """
    env = dict(os.environ)
    if not env.get("ZIG_GLOBAL_CACHE_DIR"):
        env["ZIG_GLOBAL_CACHE_DIR"] = str(cache_dir())
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True,
                              text=True)
    except OSError as exc:
        raise ZigBuildError(f"cannot run {cmd[0]}: {exc}", field="command",
                            value=list(cmd)) from None
    if proc.returncode != 0:
        raise ZigBuildError(f"command failed ({proc.returncode}): "
                            f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}",
                            field="command", value=list(cmd))


def arch_info(arch: str | ArchInfo) -> ArchInfo:
    """``arch`` from the table; it must be one the runtime runs."""
    if isinstance(arch, ArchInfo):
        return arch
    return arches.lookup(arch, runtime=True)


def target_flags(arch: str | ArchInfo, cpu: str | None = None) -> tuple[str, ...]:
    """zig ``-target``/``-mcpu`` flags for ``arch``, or for its CPU profile
    ``cpu`` (``fatelf.arches.profile(arch, cpu).zig_flags``).

    Raises:
        ZigBuildError: unknown profile, or this version has no profiles.
    """
    info = arch_info(arch)
    if cpu is None:
        return tuple(info.zig_flags)
    lookup = getattr(arches, "profile", None)
    if lookup is None:
        raise ZigBuildError("CPU profiles are not available in this version "
                            "of the architecture table", name=info.name,
                            field="cpu", value=cpu)
    try:
        flags = lookup(info.name, cpu).zig_flags
    except Exception as exc:  # noqa: BLE001 - the table's own error, retyped
        raise ZigBuildError(f"no CPU profile {cpu!r} for {info.name}: {exc}",
                            name=info.name, field="cpu", value=cpu) from None
    return tuple(flags)


def build_freestanding(source: str | Sequence[str], arch: str | ArchInfo, *,
                       cwd: Path | str, work_dir: Path | str,
                       defines: Iterable[str] = (), stem: str | None = None,
                       exports: Iterable[str] = (),
                       include_dirs: Iterable[str] = (), debug: bool = False,
                       cpu: str | None = None,
                       extra_objects: Iterable[str] = ()) -> bytes:
    """Compile and link C files into one freestanding ET_DYN.

    Args:
        source: the C file (or files), relative to ``cwd`` (kept relative so
            the bytes do not depend on where the tree is).
        arch: architecture name or table entry.
        cwd: directory the compiler runs in (includes resolve from there).
        work_dir: where the objects and the linked file are written.
        defines: extra compiler flags such as ``-DNAME=1``.
        stem: base name of the intermediate files (default: the first
            source's).
        exports: symbols that must be in the dynamic symbol table.
        include_dirs: ``-I`` directories (relative to ``cwd`` or absolute).
        debug: build with ``-g`` and keep ``.symtab`` and DWARF
            (:data:`DEBUG_LINK_FLAGS`), for fault reports with static
            function names and source lines.
        cpu: a CPU profile of ``arch`` (its zig flags replace the
            architecture's), or None.
        extra_objects: object files linked after the sources' (absolute
            paths, or relative to ``cwd``).

    Returns:
        The linked ELF's bytes, checked with :func:`check_self_contained`.

    Raises:
        ZigBuildError: ziglang missing, build failure or a failed check.
    """
    require_zig()
    info = arch_info(arch)
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    base = f"{stem or Path(sources[0]).stem}_{info.name}"
    if cpu:
        base += f"_{cpu}"
    out = Path(work_dir) / f"{base}.so"
    zig = zig_command()
    cflags = [DEBUG_CFLAGS.get(f, f) for f in CFLAGS] if debug else list(CFLAGS)
    includes = [f"-I{d}" for d in include_dirs]
    objects = []
    for i, src in enumerate(sources):
        obj = Path(work_dir) / (f"{base}.o" if len(sources) == 1
                                else f"{base}_{i}.o")
        run(zig + ["cc", *target_flags(info, cpu), *cflags, *includes,
                   *defines, "-c", str(src), "-o", str(obj)], cwd)
        objects.append(str(obj))
    run(zig + ["ld.lld", *(DEBUG_LINK_FLAGS if debug else LINK_FLAGS),
               *objects, *map(str, extra_objects), "-o", str(out)], cwd)
    data = out.read_bytes()
    check_self_contained(data, info, exports=exports, name=base + ".so")
    return data


def build_plugin(sources: Sequence[str | os.PathLike], targets: str | Sequence[str] = "all",
                 *, cpu: str | Mapping[str, str | Sequence[str]] | None = None,
                 debug: bool = False,
                 include_dirs: Iterable[str | os.PathLike] = (),
                 defines: Iterable[str] = (), jobs: int | None = None) -> bytes:
    """Build an executable plugin from C for several architectures and pack
    it as a FatELF ``.sos`` bundle (:func:`fatelf.join`).

    Args:
        sources: C files (paths as given; each compiled from its own
            directory by base name, so outputs do not depend on where the
            tree is). :func:`hal_cpu.get_include` (``plugin_abi.h``) is on
            the include path.
        targets: ``"all"`` (the six runtime architectures), or names or
            aliases, as a list or a comma-separated string.
        cpu: CPU profiles (:func:`profile_lists`): ``None`` (each
            architecture's baseline); a string of comma-separated
            ``arch:profile`` items or bare profile names, each applying to
            its own architecture (``"x86_64:x86-64-v3,aarch64:sve"``,
            ``"x86-64-v3,sve,rv64gcv"``); or a mapping from architecture to
            a profile or a list of them. Architectures not named get their
            baseline. An architecture with several profiles gets a record
            per profile, in the order given: the first is the one every
            loader picks by default (IREE's picks the first record of an
            architecture), the others differ in ``EI_ABIVERSION`` (1, 2,
            ...) and are picked by profile (:func:`select_profile`). Each
            record built for a named profile carries its name in a
            :data:`PROFILE_SECTION` section.
        debug: keep symbols and DWARF (``-g``) for reports with static
            function names and source lines.
        include_dirs, defines: more ``-I`` directories and compiler flags.
        jobs: parallel builds (default: CPUs).

    Returns:
        The bundle's bytes; each record is checked with
        :func:`check_self_contained` and exports the plugin query.

    Raises:
        ZigBuildError: ziglang missing, a build failure, an unknown
            architecture or profile.
    """
    import fatelf

    records = _build_records(sources, targets, cpu, debug=debug,
                             include_dirs=include_dirs, defines=defines,
                             jobs=jobs)
    return fatelf.join([elf for _, _, elf in records],
                       names=[_record_name(sources, a, p) for a, p, _ in records])


def build_plugin_file(sources: Sequence[str | os.PathLike], output: str | os.PathLike,
                      targets: str | Sequence[str] = "all", **options) -> list[str]:
    """:func:`build_plugin` written to ``output``: a FatELF bundle, or the
    ELF itself when ``output`` ends in ``.so`` (one architecture, one
    profile: what a ``.so`` path holds everywhere else, and what
    ``iree-compile``'s and IREE's tools expect of one).

    Returns:
        The records written, as ``arch`` or ``arch:profile`` labels.

    Raises:
        ZigBuildError: as :func:`build_plugin`, or a ``.so`` output for
            several records (field ``output``).
    """
    import fatelf

    out = os.fspath(output)
    records = _build_records(sources, targets, options.pop("cpu", None),
                             **options)
    labels = [f"{a}:{p}" if p else a for a, p, _ in records]
    objects = [elf for _, _, elf in records]
    if out.endswith(".so"):
        if len(objects) != 1:
            raise ZigBuildError(
                f"a .so holds one ELF; this build has {len(objects)} records "
                f"({', '.join(labels)}): name the output .sos for a FatELF "
                "bundle, or build one architecture and one profile",
                name=out, field="output", value=labels)
        data = objects[0]
    else:
        data = fatelf.join(objects, names=[_record_name(sources, a, p)
                                           for a, p, _ in records])
    with open(out, "wb") as f:
        f.write(data)
    return labels


def _record_name(sources, arch: str, profile: str | None) -> str:
    """``scale_plugin_aarch64_sve.so``: how errors about a record name it."""
    return (f"{Path(sources[0]).stem}_{arch}"
            + (f"_{profile}" if profile else "") + ".so")


def _build_records(sources, targets, cpu, *, debug: bool = False,
                   include_dirs: Iterable = (), defines: Iterable[str] = (),
                   jobs: int | None = None) -> list[tuple[str, str | None, bytes]]:
    """``(architecture, profile or None, ELF bytes)`` of every record of a
    :func:`build_plugin` build, in build order."""
    import concurrent.futures

    from .. import get_include

    names = _arch_names(targets)
    paths = [Path(s).resolve() for s in sources]
    if not paths:
        raise ZigBuildError("no C sources given", field="sources", value=[])
    for path in paths:
        if not path.is_file():
            raise ZigBuildError("no such source file", name=str(path),
                                field="sources", value=str(path))
    cwd = paths[0].parent
    rel = [os.path.relpath(p, cwd) for p in paths]
    dirs = [get_include(), *map(str, include_dirs)]
    jobs_list = [(name, k, profile) for name, profiles
                 in profile_lists(cpu, names).items()
                 for k, profile in enumerate(profiles)]
    with tempfile.TemporaryDirectory(prefix="hal_cpu_plugin_") as tmp:
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=jobs or os.cpu_count() or 2) as pool:
            futures = [pool.submit(_build_record, rel, name, k, profile,
                                   cwd=cwd, work_dir=Path(tmp) / f"{name}_{k}",
                                   defines=list(defines), include_dirs=dirs,
                                   debug=debug)
                       for name, k, profile in jobs_list]
            objects = [f.result() for f in futures]
    return [(name, profile, elf) for (name, _, profile), elf
            in zip(jobs_list, objects)]


def _build_record(rel, arch: str, index: int, profile: str | None, *, cwd,
                  work_dir: Path, defines, include_dirs, debug: bool) -> bytes:
    """One record of a bundle: the plugin for ``arch`` built for
    ``profile`` (None: the baseline), with the profile's name in
    :data:`PROFILE_SECTION` and ``index`` as its ``EI_ABIVERSION``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    sources = list(rel)
    if profile:
        note = work_dir / "hal_cpu_profile.s"
        note.write_text(f'.section {PROFILE_SECTION},"",%progbits\n'
                        f'.asciz "{profile}"\n')
        obj = work_dir / "hal_cpu_profile.o"
        run(zig_command() + ["cc", *target_flags(arch, profile), "-c",
                             note.name, "-o", obj.name], work_dir)
    data = build_freestanding(sources, arch, cwd=cwd, work_dir=work_dir,
                              defines=defines, exports=[PLUGIN_QUERY],
                              include_dirs=include_dirs, debug=debug,
                              cpu=profile,
                              extra_objects=[str(work_dir / "hal_cpu_profile.o")]
                              if profile else ())
    if index:
        patched = bytearray(data)
        patched[EI_ABIVERSION] = index
        data = bytes(patched)
    return data


#: Non-allocated section in which :func:`build_plugin` records the CPU
#: profile a record was built for (its name, NUL-terminated).
PROFILE_SECTION = ".hal_cpu.profile"

#: Offset of ``EI_ABIVERSION`` in ``e_ident``: the FatELF record's
#: ``osabi_version``, which tells the records of one architecture apart.
EI_ABIVERSION = 8


def profile_lists(cpu: str | Mapping[str, str | Sequence[str]] | None,
                  names: Sequence[str]) -> dict[str, list[str | None]]:
    """Architecture -> the CPU profiles to build it for (``[None]``: its
    baseline), for :func:`build_plugin`'s ``cpu``.

    A string is comma-separated items, each ``arch:profile`` (aliases
    accepted) or a bare profile name, which applies to the architecture
    whose table has it; an architecture named more than once gets each
    profile, in order. A mapping maps an architecture to a profile or a
    list of profiles; architectures it names that are not in ``names`` are
    left out (so one table serves builds of fewer architectures).

    Raises:
        ZigBuildError: an unknown architecture or profile, or (string
            form) a profile of an architecture not in ``names``.
    """
    out: dict[str, list[str | None]] = {n: [] for n in names}
    if cpu is None:
        return {n: [None] for n in names}
    pairs: list[tuple[str | None, str, bool]] = []
    if isinstance(cpu, Mapping):
        for key, value in cpu.items():
            for profile in ([value] if isinstance(value, str) else list(value)):
                pairs.append((key, profile, False))
    else:
        for item in (i.strip() for i in str(cpu).split(",") if i.strip()):
            named, sep, profile = item.rpartition(":")
            pairs.append((named if sep else None, profile, True))
    for arch, profile, strict in pairs:
        profile = profile.strip()
        if arch is None:
            owners = [p.arch for p in arches.PROFILES
                      if p.name.lower() == profile.lower()]
            if not owners:
                known = ", ".join(p.name for p in arches.PROFILES)
                raise ZigBuildError(f"unknown CPU profile {profile!r}; known: "
                                    f"{known}", field="cpu", value=cpu)
        else:
            try:
                owners = [arches.lookup(arch.strip(), runtime=True).name]
            except arches.FatElfSelectError as exc:
                raise ZigBuildError(exc.message, field="cpu", value=cpu) from None
        for owner in owners:
            if owner not in out:
                if strict:
                    raise ZigBuildError(
                        f"{profile} is a CPU profile of {owner}, which is not "
                        f"among the architectures built ({', '.join(names)})",
                        field="cpu", value=cpu)
                continue
            try:
                name = arches.profile(owner, profile).name
            except arches.FatElfSelectError as exc:
                raise ZigBuildError(f"no CPU profile {profile!r} for {owner}: "
                                    f"{exc.message}", name=owner, field="cpu",
                                    value=cpu) from None
            if name not in out[owner]:
                out[owner].append(name)
    return {n: (p or [None]) for n, p in out.items()}


def profile_map(cpu: str | Mapping[str, str] | None,
                names: Sequence[str]) -> dict[str, str | None]:
    """Architecture -> the first CPU profile :func:`profile_lists` gives it
    (None: the baseline)."""
    return {n: p[0] for n, p in profile_lists(cpu, names).items()}


def profile_of(elf) -> str | None:
    """The CPU profile an ELF was built for, from its
    :data:`PROFILE_SECTION` (None: none recorded, or not readable)."""
    from elftools.elf.elffile import ELFFile
    try:
        section = ELFFile(io.BytesIO(bytes(elf))).get_section_by_name(PROFILE_SECTION)
        if section is None:
            return None
        text = section.data().split(b"\0", 1)[0].decode("ascii")
    except Exception:  # noqa: BLE001 - a malformed file records nothing
        return None
    return text or None


def bundle_profiles(data) -> list[tuple[str, str | None]]:
    """``(architecture, profile or None)`` of each record of a FatELF
    bundle (of a plain ELF: its one), in table order."""
    import fatelf
    if not fatelf.is_fatelf(data):
        from fatelf.elf import elf_target
        t = elf_target(bytes(data), "<memory>", ZigBuildError)
        return [(arches.arch_name(t.machine, t.word_size, t.byte_order),
                 profile_of(data))]
    return [(rec.arch, profile_of(elf)) for rec, elf in fatelf.split(data)]


def select_profile(data, arch: str, cpu: str | None = None, *,
                   name: str = "<memory>") -> tuple[bytes, str | None]:
    """The ELF of a FatELF bundle for ``arch`` built for CPU profile
    ``cpu``, and the profile it was built for.

    The record of ``arch`` whose :data:`PROFILE_SECTION` names ``cpu``;
    without one (or with ``cpu`` None), the record every loader picks
    (the first of the architecture: :func:`fatelf.select`). A plain ELF is
    returned as it is.

    Raises:
        fatelf.FatElfError: not a valid bundle, or no record for ``arch``.
    """
    import fatelf
    data = bytes(data)
    if not fatelf.is_fatelf(data):
        return data, profile_of(data)
    bundle = fatelf.FatElf.parse(data, name)
    want = arches.lookup(arch, runtime=True).name
    if cpu:
        wanted = cpu.strip().lower()
        for rec, elf in bundle.split():
            if rec.arch == want and rec.osabi in fatelf.format.RUNTIME_OSABIS:
                got = profile_of(elf)
                if got is not None and got.lower() == wanted:
                    return elf, got
    elf = bundle.select(want)
    return elf, profile_of(elf)


def profile_image(path: str | os.PathLike, arch: str, cpu: str | None = None):
    """:func:`select_profile` of the file at ``path``, verified as an
    :class:`elfloader.ElfImage` named ``path[arch:profile]`` (what
    :class:`hal_cpu.plugins.PluginManager.register_embedded` and
    :class:`hal_cpu.Executable` take in place of a path).

    Raises:
        elfloader.ElfError: the file is unreadable, not an ELF or bundle, or
            holds nothing for ``arch``.
    """
    import elfloader
    from fatelf.errors import FatElfError
    from fatelf.files import read_regular
    from fatelf.format import MAX_FILE_BYTES
    label = os.fspath(path)
    data = read_regular(path, elfloader.ElfFormatError, MAX_FILE_BYTES)
    try:
        elf, got = select_profile(data, arch, cpu, name=label)
    except FatElfError as exc:
        raise elfloader.ElfFormatError(exc.message, name=label,
                                       field=exc.field, value=exc.value) from None
    info = arches.lookup(arch, runtime=True)
    return elfloader.read_image(elf, arch=info.name,
                                name=f"{label}[{info.name}"
                                + (f":{got}" if got else "") + "]")


def _arch_names(spec: str | Sequence[str]) -> list[str]:
    """Canonical names for ``"all"``, names/aliases or a comma list."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (i.strip() for i in items if i.strip()):
        try:
            picked = (list(arches.RUNTIME_ARCHES) if item == "all"
                      else [arches.lookup(item, runtime=True).name])
        except arches.FatElfSelectError as exc:
            raise ZigBuildError(exc.message, field="arch", value=item) from None
        names += [n for n in picked if n not in names]
    if not names:
        raise ZigBuildError("no architecture given", field="arch", value=spec)
    return names


def _relative_types(info: ArchInfo) -> set[int]:
    from elfloader import arch as registry

    loader_arch = registry.by_name(info.name)
    return {n for n, r in loader_arch.relocations.items()
            if r.name.endswith("_RELATIVE")}


def check_self_contained(data: bytes, arch: str | ArchInfo, *,
                         exports: Iterable[str] = (),
                         name: str | None = None) -> None:
    """Check that ``data`` is a self-contained ET_DYN for ``arch``.

    Checks: ET_DYN of the architecture's machine, class and byte order; no
    ``DT_NEEDED``; no undefined dynamic symbol; only RELATIVE relocations in
    allocated relocation sections; every name in ``exports`` defined.

    Raises:
        ZigBuildError: lists every problem found.
    """
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    info = arch_info(arch)
    elf = ELFFile(io.BytesIO(data))
    problems = []
    if elf.header["e_type"] != "ET_DYN":
        problems.append(f"e_type {elf.header['e_type']}")
    if elf.header["e_machine"] != arches.machine_name(info.machine):
        problems.append(f"e_machine {elf.header['e_machine']}")
    if elf.elfclass != info.elf_class:
        problems.append(f"ELF class {elf.elfclass}")
    if elf.little_endian != (info.byte_order == "little"):
        problems.append("byte order")
    relative = _relative_types(info)
    defined = set()
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    # (pyelftools sets ``needed`` on DT_NEEDED tags only)
                    problems.append(f"DT_NEEDED {tag.needed}")  # type: ignore[attr-defined]
        if section.name == ".dynsym" and isinstance(section, SymbolTableSection):
            for sym in section.iter_symbols():
                if not sym.name:
                    continue
                if sym["st_shndx"] == "SHN_UNDEF":
                    problems.append(f"undefined symbol {sym.name}")
                else:
                    defined.add(sym.name)
        if isinstance(section, RelocationSection) and section["sh_flags"] & 0x2:
            for reloc in section.iter_relocations():
                if reloc["r_info_type"] not in relative:
                    problems.append(f"relocation type {reloc['r_info_type']} "
                                    f"in {section.name}")
    for symbol in exports:
        if symbol not in defined:
            problems.append(f"{symbol} not exported")
    if problems:
        raise ZigBuildError("; ".join(problems), name=name or info.name,
                            field="output", value=problems)


__all__ = ["ZIG_VERSION", "CFLAGS", "LINK_FLAGS", "DEBUG_CFLAGS",
           "DEBUG_LINK_FLAGS", "PLUGIN_QUERY", "ZigBuildError", "build_plugin",
           "build_plugin_file", "profile_lists", "profile_map", "profile_of",
           "bundle_profiles", "select_profile", "profile_image",
           "PROFILE_SECTION", "target_flags",
           "zig_available", "zig_version", "version_warning", "require_zig",
           "zig_command", "run", "arch_info", "build_freestanding",
           "check_self_contained"]
