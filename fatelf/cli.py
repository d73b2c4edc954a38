"""``fatelf`` command line tool.

Subcommands (the verbs of icculus/fatelf's fatelf-* tools and IREE's
iree-fatelf)::

    fatelf join [-o OUT] ELF...             bundle ELFs (stdout without -o)
    fatelf split FAT [--output-dir DIR]     one ELF per record, paths printed
    fatelf select FAT [--arch ARCH] [-o OUT] ELF a loader would pick (host arch
                                            by default); a plain ELF passes through
    fatelf dump FAT                         every header and record field
    fatelf info FAT                         human summary of the bundle
    fatelf validate FAT                     full validation
    fatelf extract FAT --arch T [-o OUT]    the ELF of target T (stdout without -o)
    fatelf remove FAT --arch T [-o OUT]     bundle without target T
    fatelf replace FAT ELF [-o OUT]         bundle with ELF replacing the record
                                            of the same target
    fatelf verify FAT --arch T              exit 0 if the bundle has target T

``split`` names each file ``<bundle stem>_<name>.so`` in DIR (default: the
bundle's directory), where ``<name>`` is the record's architecture name
(``bundle.sos`` -> ``bundle_x86_64.so``), or, when two records share an
architecture, ``<arch>_<osabi>_osabiver<N>``.

Targets ``T`` for extract/remove/verify are described in
:mod:`fatelf.targets` (``x86_64``, ``arm64:linux``, ``record2``...).

icculus' fatelf-remove and fatelf-replace always write a new file
(``<out> <in> <target>``) and leave the input alone; here ``-o OUT`` does the
same, and without ``-o`` the bundle is rewritten in place (a new file is
written next to it and renamed over it, so a failure leaves it intact).

``join``, ``select`` and ``extract`` write an ELF or a bundle to stdout when
``-o`` is not given; they refuse to when stdout is a terminal.

No output path is followed or replaced when it is a symlink (another user
may have planted it pointing at a file of yours): the command fails with
:class:`fatelf.private_dirs.UnsafePathError` naming the path, and ``split``
checks every path before writing the first. Files are written as a new file
in the destination folder and renamed over the path (a FIFO or device such
as ``/dev/null`` is written in place).

Exit status: 0 on success; 1 on invalid input, an unreadable or unwritable
file or a failed check (a one-line ``fatelf: <reason>`` on stderr), and,
quietly, when stdout is closed early; 2 on usage errors, including binary
output to a terminal; 130 when interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys
from importlib import metadata
from pathlib import Path

from . import build, targets
from .arches import host, machine_name, osabi_name
from .elf import elf_target
from .errors import FatElfInputError, PortableKernelError
from .format import BYTE_ORDER_CODES, WORD_SIZE_CODES, FatElf, is_fatelf, read_file, read_table
from .private_dirs import UnsafePathError
from .text import for_terminal

PROG = "fatelf"
DISTRIBUTION = "portable-kernel-runtime"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
TERMINAL_REFUSAL = "refusing to write binary data to a terminal; use -o FILE or redirect"


def _read(path: str) -> bytes:
    # Regular files only, opened without blocking, at most 1 GiB.
    return read_file(path)


def _load(path: str) -> FatElf:
    return FatElf.parse(_read(path), path)


def _output_target(path: str | Path) -> os.stat_result | None:
    """What is at output ``path`` now (``lstat``), or None when nothing is.

    Raises:
        UnsafePathError: it is a symlink (never followed or replaced: it may
            point at a file another user wants overwritten) or a directory.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(os.fspath(path))
        raise UnsafePathError(
            f"the output path is a symlink (to {target!r}); refusing to "
            f"write through it or replace it: remove it or choose another path",
            name=os.fspath(path), field="output", value=target)
    if stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("the output path is a directory", name=os.fspath(path),
                              field="output", value=stat.filemode(st.st_mode))
    return st


def _write(path: str | Path | None, data: bytes) -> None:
    """Write ``data`` to stdout (``path`` None) or to ``path``.

    A new or regular file is written as a new file in its folder
    (``O_EXCL``, never following a symlink) and renamed over ``path``, so a
    failure leaves what was there; an existing regular file keeps its mode.
    A FIFO or device (``/dev/null``) is written in place, opened with
    ``O_NOFOLLOW``.

    Raises:
        UnsafePathError: ``path`` is a symlink or a directory.
        OSError: the file cannot be written.
    """
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    st = _output_target(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        fd = os.open(path, os.O_WRONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    while True:
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.fatelf-tmp")
        try:
            # mode 0666 less the umask, as open() would make it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        _output_target(path)    # still no symlink there
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _rewrite(path: str, data: bytes) -> None:
    """Replace the bundle ``path`` with ``data`` atomically, keeping its
    permissions (:func:`_write`).

    Raises:
        UnsafePathError: ``path`` is a symlink (or not a regular file).
    """
    st = _output_target(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafePathError("the bundle to rewrite in place is not a regular file",
                              name=path, field="output", value=stat.filemode(st.st_mode))
    _write(path, data)


def cmd_join(args) -> int:
    data = build.join([_read(p) for p in args.elfs], names=args.elfs)
    _write(args.output, data)
    return 0


def cmd_split(args) -> int:
    fat = _load(args.fat)
    outdir = Path(args.output_dir) if args.output_dir else Path(args.fat).parent
    outdir.mkdir(parents=True, exist_ok=True)
    stem = Path(args.fat).stem
    outputs = [(outdir / f"{stem}_{label.replace(':', '_')}.so", elf)
               for label, (_, elf) in zip(targets.target_names(fat), fat.split())]
    for path, _ in outputs:     # every path checked before the first is written
        _output_target(path)
    for path, elf in outputs:
        _write(path, elf)
        print(path)
    return 0


def cmd_select(args) -> int:
    data = _read(args.fat)
    if is_fatelf(data):
        elf = FatElf.parse(data, args.fat).select(args.arch)
    else:
        try:
            elf_target(data, args.fat, FatElfInputError)
        except FatElfInputError as e:
            raise FatElfInputError(f"{e.message}, and not a FatELF either", name=e.name,
                                   field=e.field, value=e.value) from None
        elf = data
    _write(args.output, elf)
    return 0


def cmd_dump(args) -> int:
    data = _read(args.fat)
    raw = read_table(data, args.fat)
    out = ["fatelf_header:",
           f"       magic: {raw.magic:08X}",
           f"     version: {raw.version}",
           f"     records: {raw.record_count}",
           f"    reserved: {raw.reserved:02X}",
           ""]
    for i, r in enumerate(raw.records):
        bits = WORD_SIZE_CODES.get(r.word_size)
        order = BYTE_ORDER_CODES.get(r.byte_order)
        out += [f"fatelf_record[{i}]:",
                f"     machine: {r.machine} / {r.machine:04X} = {machine_name(r.machine)}",
                f"       osabi: {r.osabi} / {r.osabi:02X} = {osabi_name(r.osabi)}",
                f"     version: {r.osabi_version} / {r.osabi_version:02X}",
                f"   word_size: {r.word_size} / {r.word_size:02X} = "
                + (f"ELFCLASS{bits}" if bits else "<unknown>"),
                f"  byte_order: {r.byte_order} / {r.byte_order:02X} = "
                + ({"big": "ELFDATA2MSB (big-endian)", "little": "ELFDATA2LSB (little-endian)"}
                   .get(order or "", "<unknown>")),
                f"   reserved0: {r.reserved0} / {r.reserved0:02X}",
                f"   reserved1: {r.reserved1} / {r.reserved1:02X}",
                f"      offset: {r.offset} / {r.offset:016X}",
                f"        size: {r.size} / {r.size:016X}",
                ""]
    print("\n".join(out), end="")
    sys.stdout.flush()
    FatElf.parse(data, args.fat)  # report (after the dump) if anything is wrong
    return 0


def cmd_info(args) -> int:
    fat = _load(args.fat)
    names = targets.target_names(fat)
    print(f"{fat.name}: FatELF format version 1")
    print(f"{len(fat.records)} records.")
    if fat.trailer:
        print(f"{len(fat.trailer)} bytes of junk appended, starting at offset "
              f"{fat.payload_end}.")
    for i, rec in enumerate(fat.records):
        print(f"Binary at index #{i}: {rec.arch}")
        print(f"  OSABI {rec.osabi} ({osabi_name(rec.osabi)}) version {rec.osabi_version}")
        print(f"  {rec.word_size} bits")
        print(f"  {rec.byte_order}-endian byte order")
        print(f"  Machine {rec.machine} ({machine_name(rec.machine)})")
        print(f"  Offset {rec.offset} ({rec.offset:#x})")
        print(f"  Size {rec.size} ({rec.size:#x})")
        print(f"  Target name: '{names[i]}' or 'record{i}'")
    return 0


def cmd_validate(args) -> int:
    fat = _load(args.fat)
    print(f"{fat.name}: valid FatELF version 1, {len(fat.records)} records: "
          f"{', '.join(fat.arches)}")
    return 0


def cmd_extract(args) -> int:
    fat = _load(args.fat)
    _write(args.output, fat.payload(targets.resolve(fat, args.arch)))
    return 0


def _emit_bundle(args, data: bytes) -> None:
    if args.output is None:
        _rewrite(args.fat, data)
    else:
        _write(args.output, data)


def cmd_remove(args) -> int:
    data = _read(args.fat)
    idx = targets.resolve(FatElf.parse(data, args.fat), args.arch)
    _emit_bundle(args, build.remove(data, idx, args.fat))
    return 0


def cmd_replace(args) -> int:
    data = build.replace(_read(args.fat), _read(args.elf), args.fat, args.elf)
    _emit_bundle(args, data)
    return 0


def cmd_verify(args) -> int:
    fat = _load(args.fat)
    found = targets.matching_indices(fat, args.arch)
    if not found:
        print(f"{PROG}: {fat.name}: no record for target {args.arch!r}; the bundle holds: "
              f"{', '.join(targets.target_names(fat))}", file=sys.stderr)
        return 1
    print(f"{fat.name}: has {args.arch} (record {', '.join(map(str, found))})")
    return 0


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fatelf`` command."""
    p = argparse.ArgumentParser(
        prog=PROG, description="Read, write, validate and select FatELF v1 bundles.",
        epilog="Exit status: 0 success, 1 invalid input or failed check, 2 usage error, "
               "130 interrupted.")
    p.add_argument("--version", action="version", version=f"{PROG} {_version()}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, func, help_text, *, binary_stdout=False):
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.set_defaults(func=func, binary_stdout=binary_stdout)
        return sp

    def fat(sp):
        sp.add_argument("fat", metavar="FAT", help="the FatELF bundle")

    def out(sp, what):
        sp.add_argument("-o", "--output", metavar="OUT", help=what)

    def target(sp, what):
        sp.add_argument("--arch", required=True, metavar="TARGET",
                        help=f"{what}: an architecture name with optional :qualifiers "
                             f"(le, be, 32bit, 64bit, an OSABI name, osabiver<N>), "
                             f"or record<N>")

    sp = add("join", cmd_join, "Bundle ELF files into one FatELF.", binary_stdout=True)
    sp.add_argument("elfs", nargs="+", metavar="ELF",
                    help="an ELF file to bundle (one per target)")
    out(sp, "output file (default: stdout, which must not be a terminal)")

    sp = add("split", cmd_split, "Write every ELF of a bundle to <stem>_<arch>.so files.")
    fat(sp)
    sp.add_argument("--output-dir", metavar="DIR",
                    help="directory for the ELFs (default: the bundle's directory)")

    sp = add("select", cmd_select,
             "Write the ELF a loader would pick for ARCH (OSABI none/linux/standalone).",
             binary_stdout=True)
    sp.add_argument("fat", metavar="FAT",
                    help="the FatELF bundle, or a plain ELF (written out unchanged)")
    info = host()
    sp.add_argument("--arch", default=None,
                    help=f"architecture name (default: host, "
                         f"{info.name if info else 'unknown'})")
    out(sp, "output file (default: stdout, which must not be a terminal)")

    sp = add("dump", cmd_dump, "Print every header and record field.")
    fat(sp)

    sp = add("info", cmd_info, "Describe a bundle and its records.")
    fat(sp)

    sp = add("validate", cmd_validate, "Check a bundle thoroughly.")
    fat(sp)

    sp = add("extract", cmd_extract, "Write the ELF of one target.", binary_stdout=True)
    fat(sp)
    target(sp, "the record to write")
    out(sp, "output file (default: stdout, which must not be a terminal)")

    sp = add("remove", cmd_remove, "Remove the record of one target.")
    fat(sp)
    target(sp, "the record to remove")
    out(sp, "output file (default: rewrite FAT in place)")

    sp = add("replace", cmd_replace, "Replace the record with the same target as ELF.")
    fat(sp)
    sp.add_argument("elf", metavar="ELF", help="the ELF to put in place of its target's record")
    out(sp, "output file (default: rewrite FAT in place)")

    sp = add("verify", cmd_verify, "Exit 0 if the bundle holds a target, 1 otherwise.")
    fat(sp)
    target(sp, "the target to look for")
    return p


def _fail(message: str, status: int = 1) -> int:
    # one line, control characters of a file's text escaped (fatelf.text)
    print(for_terminal(f"{PROG}: {' '.join(str(message).split())}"), file=sys.stderr)
    return status


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status: 0 success, 1 for a
    :class:`~fatelf.errors.PortableKernelError` or ``OSError`` (reported on
    one line) or a closed stdout (quietly), 2 for usage errors, 130 for
    ``KeyboardInterrupt``.

    Raises:
        SystemExit: from ``argparse`` (status 2 for usage errors, 0 for
            ``--help`` and ``--version``).
    """
    try:
        try:
            args = build_parser().parse_args(argv)
        finally:
            sys.stdout.flush()  # --help and --version print before exiting
        if args.binary_stdout and args.output is None and _is_terminal(sys.stdout):
            return _fail(TERMINAL_REFUSAL, 2)
        status = args.func(args)
        sys.stdout.flush()
        return status
    except PortableKernelError as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}")


if __name__ == "__main__":
    sys.exit(main())
