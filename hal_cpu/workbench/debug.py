"""A dispatch under gdb: qemu-user's gdb stub and ``gdb-multiarch``.

:class:`Debugger` arms an executable loaded on the emulated backend's qemu
engine: the next call of its first CPU (worker 0) starts a new guest agent
under qemu-user's gdb stub (``qemu-<arch> -g PATH``), whose socket lies in
a private folder made for the session
(:func:`fatelf.private_dirs.cache_folder`, ``debug/session-*``). That
agent's sandbox may make and serve that one UNIX socket and nothing more
(:mod:`elfloader.backend.emulated.sandbox`); its calls have no time limit,
since a person holds them. Once the agent listens, gdb starts
(:func:`gdb_command`): it connects, adds the symbols and DWARF of the
executable and its plugins at their load addresses (``add-symbol-file FILE
-o BASE``; each module's ELF bytes, as loaded, written to the session
folder), sets a breakpoint on the export's first instruction and
continues, so it stops when the dispatch reaches the export. With a batch
file gdb then runs it and exits (``-batch -x FILE``); otherwise the person
at the terminal debugs. When gdb continues (or detaches), the dispatch
completes; closing the executable ends the agent, which gdb sees exit.

:class:`ProgramDebugger` does the same for a program (``run-module``):
the first call of the runtime's workgroup loop or dispatch batch any qemu
CPU of the process makes (:func:`elfloader.backend.emulated.qemu_engine.
debug_calls`) runs under the stub, with breakpoints on the export
functions it runs and every module of that address space in gdb.

The runtime's workgroup loop (:data:`hal_cpu.runtime.BUNDLE`), which
calls the export, is loaded before the dispatch and added too (its
exported functions are named; the loop's body is a local function
without a symbol, ``??`` in ``bt``). Only the qemu engine has a gdb stub: unicorn and native runs
are refused (:class:`DebugError`).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from fatelf.errors import PortableKernelError
from fatelf.private_dirs import cache_folder, check_private_dir, temp_root

from ..errors import HalCpuError

__all__ = ["GDB", "DebugError", "Debugger", "ProgramDebugger", "find_gdb",
           "gdb_command", "session_folder"]

#: The gdb that reads every guest architecture (Debian's ``gdb-multiarch``).
GDB = "gdb-multiarch"
#: Longest UNIX socket path, bytes (``sun_path`` holds 108 with its NUL).
_SOCKET_PATH_MAX = 107


class DebugError(HalCpuError):
    """A dispatch cannot run under gdb: no ``gdb-multiarch``, a backend or
    engine without a gdb stub (native, unicorn), an option debugging does
    not take, or no private folder for the socket. ``field`` names what
    (``--backend``, ``--engine``, ``gdb``...), ``value`` what was found."""


def find_gdb(program: str | None = None) -> str:
    """The path of gdb: ``program`` (a name on ``PATH`` or a path), default
    :data:`GDB`.

    Raises:
        DebugError: not found (``field`` ``gdb``, ``value`` the name).
    """
    name = program or GDB
    found = shutil.which(name)
    if found is None:
        raise DebugError(f"{name} is not installed (Debian, Ubuntu: apt-get "
                         f"install gdb-multiarch); it debugs every guest "
                         "architecture", field="gdb", value=name)
    return found


def session_folder() -> Path:
    """A new private folder (mode 0700, this user's) for one session's
    socket and symbol files: ``<cache>/portable-kernel-runtime/debug/
    session-*``, or beneath :func:`fatelf.private_dirs.temp_root` when that
    path would make the socket's too long.

    Raises:
        DebugError: no private folder can be made (``field``
            ``cache.*`` or ``folder``).
    """
    for parent in (None, temp_root() / "debug"):
        try:
            if parent is None:
                base = cache_folder("debug", DebugError)
            else:
                from fatelf.private_dirs import private_dir
                base = private_dir(parent, DebugError, root=temp_root(),
                                   field="folder")
        except OSError:
            continue
        folder = Path(tempfile.mkdtemp(prefix="session-", dir=base))
        check_private_dir(folder, DebugError, field="folder")
        if len(os.fsencode(folder / "agent.sock")) <= _SOCKET_PATH_MAX:
            return folder
        folder.rmdir()
    raise DebugError("no private folder whose socket path fits in 107 bytes "
                     "(set XDG_CACHE_HOME or TMPDIR to a shorter path)",
                     field="folder", value=str(temp_root()))


def gdb_command(gdb: str, socket_path: str,
                symbols: list[tuple[str, int]], address: int | list[int],
                label: str = "", batch: str | None = None) -> list[str]:
    """The gdb command line (argv) that connects to the stub at
    ``socket_path``, adds each ``(file, load offset)`` of ``symbols``
    (``add-symbol-file FILE -o OFFSET``: an ELF's section addresses plus
    OFFSET, the module's base), breaks at ``address`` (the export
    ``label``'s first instruction, or each of a list's; a Thumb bit is
    cleared) and continues; with ``batch``, then runs that file and
    exits."""
    argv = [gdb, "-q", "-nx"]
    if batch is not None:
        argv.append("-batch")
    argv += ["-ex", "set confirm off", "-ex", "set pagination off",
             "-ex", f"target remote {socket_path}"]
    for path, offset in symbols:
        argv += ["-ex", f"add-symbol-file {path} -o {offset:#x}"]
    if label:
        argv += ["-ex", f"echo breakpoint on export {label}\\n"]
    for each in ([address] if isinstance(address, int) else address):
        argv += ["-ex", f"break *{each & ~1:#x}"]
    argv += ["-ex", "set confirm on", "-ex", "continue"]
    if batch is not None:
        argv += ["-x", batch]
    return argv


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(name))[-80:] or "module"


def _write_modules(folder: Path, modules) -> list[tuple[str, int]]:
    """Each loaded module's (:class:`elfloader.ElfModule`) ELF bytes in
    ``folder``, with its base (the offset gdb adds to the file's
    addresses)."""
    out = []
    for i, module in enumerate(modules):
        path = folder / f"{i}-{_file_name(module.name)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(module.image.data)
        out.append((str(path), module.base))
    return out


class Debugger:
    """One dispatch of ``exe`` under gdb (see the module docstring).

    Args:
        exe: a :class:`hal_cpu.library.Executable` on the emulated
            backend's qemu engine, loaded with no time limit
            (``timeout=0``), its plugins on the same backend.
        export: the export (name or ordinal) the breakpoint is set on.
        gdb: gdb's path (:func:`find_gdb`); None with ``command_only``.
        batch: a gdb script run after the set-up, then gdb exits
            (``--gdb_batch``); None: gdb is interactive, on this terminal.
        command_only: print gdb's command line on ``out`` instead of
            starting gdb; the dispatch waits for someone to run it.
        out: where the command line goes.

    Use: ``with Debugger(exe, export, ...) as dbg:`` dispatch with one
    worker, then close ``exe`` and its backend (with plugins, the plugin
    manager's: close the manager), which ends the agent gdb continues,
    then ``dbg.wait()``, whether the dispatch succeeded or raised.

    Raises:
        DebugError: not the qemu engine (``field`` ``--backend`` or
            ``--engine``), or no private folder.
    """

    def __init__(self, exe, export, *, gdb: str | None = None,
                 batch: str | None = None, command_only: bool = False,
                 out: IO[str] | None = None):
        from elfloader.backend.emulated.qemu_engine import GdbStub
        backend = exe.backend
        if backend.kind != "emulated":
            raise DebugError("a native dispatch cannot run under gdb here: "
                             "debug runs the dispatch emulated under "
                             "qemu-user's gdb stub (--backend emulated)",
                             name=exe.path, field="--backend",
                             value=backend.kind)
        cpu = getattr(backend, "cpu", None)
        if backend.engine != "qemu" or not hasattr(cpu, "debug_next"):
            raise DebugError(f"the {backend.engine} engine has no gdb stub: "
                             "debugging needs the qemu engine (--engine qemu)",
                             name=exe.path, field="--engine",
                             value=backend.engine)
        self.exe = exe
        entry = exe.export(export)
        self.label, self.address = entry.label, entry.address
        self.gdb, self.batch = gdb, batch
        self.command_only = command_only
        self.out = out or sys.stdout
        self.folder = session_folder()
        #: ``(symbol file, load offset)`` of the executable, its plugins and
        #: the runtime's workgroup loop.
        self.symbols = self._write_symbols()
        self.proc: subprocess.Popen | None = None
        self.argv: list[str] = []
        self._watch: threading.Thread | None = None
        self._old_sigint: Any = None
        self.stub = GdbStub(str(self.folder), self._listening)

    def _write_symbols(self) -> list[tuple[str, int]]:
        """Each loaded module's ELF bytes in the session folder, with its
        base (the offset gdb adds to the file's addresses)."""
        modules = [self.exe.module] + [
            p.module for p in getattr(self.exe.plugins, "plugins", ()) or ()
            if getattr(p, "module", None) is not None]
        out = _write_modules(self.folder, modules)
        # The runtime's workgroup loop, which calls the export: loaded now
        # (the dispatch would load it first thing) to be named in ``bt``.
        import elfloader

        from .. import runtime
        from ..dispatch import loop_function
        loop = loop_function(self.exe.backend)
        image = elfloader.read_image(runtime.BUNDLE, arch=self.exe.arch.name)
        path = self.folder / f"{len(out)}-runtime.so"
        path.write_bytes(image.data)
        out.append((str(path), loop - image.exports[runtime.LOOP_SYMBOL]))
        return out

    def __enter__(self) -> "Debugger":
        if self.batch is None and not self.command_only and (
                threading.current_thread() is threading.main_thread()):
            # Ctrl-C belongs to gdb (it interrupts the guest) while it runs.
            self._old_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.exe.backend.cpu.debug_next(self.stub)
        return self

    def __exit__(self, *exc) -> None:
        # gdb goes on until the agent ends (the caller closes the backend
        # and then calls wait(), after an error too).
        pass

    def _listening(self, path: str, pid: int) -> None:
        """The agent waits at ``path``: start gdb (or say how)."""
        self.argv = gdb_command(self.gdb or GDB, path, self.symbols,
                                self.address, self.label, self.batch)
        if self.command_only:
            print(shlex.join(self.argv), file=self.out, flush=True)
            print(f"hal-cpu: the dispatch waits for gdb at {path} (agent "
                  f"pid {pid}); run the command above", file=sys.stderr,
                  flush=True)
            return
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL if self.batch else None)
        self._watch = threading.Thread(target=self._release, args=(path,),
                                       daemon=True)
        self._watch.start()

    def _release(self, path: str) -> None:
        """Once gdb exits, let an agent still waiting for it go on: a
        connection that closes at once makes qemu-user's stub run the
        guest without gdb (harmless once gdb had connected)."""
        assert self.proc is not None
        self.proc.wait()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(path)
        except OSError:
            pass

    def wait(self) -> int:
        """Wait for gdb to end (after the executable is closed, which ends
        the agent gdb continues); returns its exit status (0 without a gdb
        started here). Removes the session folder."""
        try:
            status = self.proc.wait() if self.proc is not None else 0
        finally:
            self.close()
        return status

    def close(self) -> None:
        """End gdb if it still runs, restore Ctrl-C, remove the folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._old_sigint is not None:
            signal.signal(signal.SIGINT, self._old_sigint)
            self._old_sigint = None
        shutil.rmtree(self.folder, ignore_errors=True)


#: hal_cpu_dispatch_batch's batch and dispatch records (``workgroup_loop.c``):
#: the records' address at offset 0, their count at 16; a record's
#: function at offset 0, records 64 bytes apart.
_BATCH_RECORDS, _BATCH_COUNT, _RECORD_SIZE = 0, 16, 64


@functools.lru_cache(maxsize=None)
def _runtime_image(arch: str):
    """The runtime support library for ``arch``, read and verified once."""
    import elfloader

    from .. import runtime
    return elfloader.read_image(runtime.BUNDLE, arch=arch)


def _runtime_call(space, address: int) -> tuple[str, int, bytes] | None:
    """``(symbol, base, ELF bytes)`` when ``address`` is the workgroup loop
    or the dispatch batch of the runtime loaded at ``base`` in ``space``
    (its ELF header is there), else None."""
    from .. import runtime
    image = _runtime_image(space.arch.name)
    header = image.data[:64]
    for symbol in (runtime.LOOP_SYMBOL, runtime.BATCH_SYMBOL):
        base = address - image.exports[symbol]
        try:
            if base >= 0 and space.read(base, len(header)) == header:
                return symbol, base, image.data
        except PortableKernelError:
            continue
    return None


def _dispatched(space, symbol: str, args) -> list[int]:
    """The export functions a call of the runtime's ``symbol`` with
    ``args`` runs: the workgroup loop's first argument, or each record's
    function of a dispatch batch (read from guest memory)."""
    import struct

    from .. import runtime
    if not args:
        return []
    if symbol == runtime.LOOP_SYMBOL:
        return [args[0]]
    fns = []
    try:
        head = space.read(args[0], 24)
        records, = struct.unpack_from("<Q", head, _BATCH_RECORDS)
        count, = struct.unpack_from("<I", head, _BATCH_COUNT)
        for i in range(min(count, 256)):
            fn, = struct.unpack("<Q", space.read(records + i * _RECORD_SIZE,
                                                 8))
            fns.append(fn)
    except PortableKernelError:
        return []   # a batch the runtime refuses: not debugged
    return list(dict.fromkeys(fns))


class ProgramDebugger(Debugger):
    """The first dispatch a program runs (``run-module``), under gdb.

    While it is entered, every call of a qemu CPU in this process is
    looked at (:func:`elfloader.backend.emulated.qemu_engine.debug_calls`):
    the first call of the runtime's workgroup loop (a dispatch) runs,
    with the rest of that CPU's calls, in an agent under qemu-user's gdb
    stub; gdb gets every module loaded in that CPU's address space (the
    executable, its plugins, the runtime) and breaks at the function the
    loop was given (the export). Other calls, and that dispatch's
    workgroups on other CPUs, run as usual: run the program with one
    worker.

    Args: as :class:`Debugger`'s ``gdb``, ``batch``, ``command_only`` and
    ``out``.

    Use: ``with ProgramDebugger(...) as dbg:`` run the program, then
    ``dbg.wait()`` (which first closes the debugged address space, ending
    the agent gdb continues), whether the program succeeded or raised.
    """

    def __init__(self, *, gdb: str | None = None, batch: str | None = None,
                 command_only: bool = False, out: IO[str] | None = None):
        self.exe = None
        self.label = ""
        #: The export functions the breakpoints are on.
        self.address: list[int] = []
        self.gdb, self.batch = gdb, batch
        self.command_only = command_only
        self.out = out or sys.stdout
        self.folder = session_folder()
        self.symbols = []
        self.proc = None
        self.argv = []
        self._watch = None
        self._old_sigint = None
        #: The address space whose dispatch runs under gdb (None: no
        #: dispatch yet).
        self.space: Any = None
        self._old_hook: Any = None

    def __enter__(self) -> "ProgramDebugger":
        from elfloader.backend.emulated import qemu_engine
        if self.batch is None and not self.command_only and (
                threading.current_thread() is threading.main_thread()):
            self._old_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._old_hook = qemu_engine.debug_calls(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        from elfloader.backend.emulated import qemu_engine
        qemu_engine.debug_calls(self._old_hook)

    def _hook(self, cpu, address: int, args):
        """The qemu engine asks before a call: a stub for the first
        call of the workgroup loop, else None."""
        if self.space is not None:
            return None
        space = cpu.space
        found = _runtime_call(space, address)
        fns = _dispatched(space, found[0], args) if found else []
        if not found or not fns:
            return None
        from elfloader.backend.emulated.qemu_engine import GdbStub
        self.space = space
        self.address = fns
        # the executables and plugins in this space, in load order, then
        # the runtime
        modules = space.modules
        self.symbols = _write_modules(self.folder, modules)
        path = self.folder / f"{len(modules)}-runtime.so"
        path.write_bytes(found[2])
        self.symbols.append((str(path), found[1]))
        return GdbStub(str(self.folder), self._listening)

    def wait(self) -> int:
        """Close the debugged address space (ending the agent gdb
        continues), then wait for gdb as :meth:`Debugger.wait`."""
        if self.space is not None:
            try:
                self.space.close()
            except Exception:  # noqa: BLE001 - a CPU still runs: gdb ends it
                pass
        return super().wait()
