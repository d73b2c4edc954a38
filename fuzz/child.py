"""One case, run in its own process, doing what a user does with the file.

* ``elf``: ``hal_cpu.Executable(data, backend=...)``, then one dispatch of
  export 0 with bindings sized from ``hal_cpu/samples/manifest.json``, then
  ``close()``;
* ``plugin``: ``PluginManager(arch, backend).register_embedded(data)``, a
  resolve of the sample plugin's import names, then ``close()``;
* ``code``: as ``elf`` (the file's export 0 has hostile code; emulated
  only), recording the engine, and for a fault its kind and system call;
* ``fatelf``: ``fatelf.FatElf.parse(data)``, ``elfloader.read_image(data,
  arch=...)``, then what the bundle is for: the plugin bundles are
  registered like a plugin, the runtime bundle is loaded with
  ``elfloader.load`` and its workgroup loop called once with NULL
  arguments (it must answer LOOP_INVALID).

The child reports to the parent through a pipe, one line per event, before
the event happens, so a process killed by a signal has said where it was:

* ``S <stage>``: a stage starts: ``parse``, ``verify``, ``map``,
  ``relocate``, ``init``, ``loaded`` (the load returned), ``query``,
  ``dispatch``, ``resolve``, ``close``
  (loader stages reached again inside ``dispatch`` and later read e.g.
  ``dispatch/verify``: the runtime library being loaded);
* ``M <lo> <hi> <name>``: a module's address range, once reserved;
* ``G+ <address>`` / ``G-``: a call into guest code starts / returned;
* ``C+`` / ``C-``: guest code called back into the host / it returned;
* ``P <pid>``: a guest agent process started (qemu engine);
* ``K <stage>``: the process kills itself now, on purpose (``code`` cases
  with ``kill_host_after``);
* ``R <json>``: the outcome (``accepted``, ``typed``, ``escape``,
  ``blowup``) with the error's class, field, message and traceback.

``faulthandler`` writes to the same pipe: on a fatal signal it dumps the
Python stack, and shortly before the parent's time limit it dumps every
thread's stack, so crashes and hangs name the Python line they were at.
Nothing of the library is changed: the reporting wraps methods of its
classes in this process only.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import re
import resource
import sys
import traceback

#: Stages in which guest code of the file runs (initializers, the query
#: function, plugin load/resolve/unload, dispatch functions, finalizers).
GUEST_STAGES = ("init", "query", "dispatch", "resolve", "close")

#: Import names the sample plugins provide (and one optional miss).
PLUGIN_IMPORTS = ["simple_mul_workgroup", "param_add_workgroup", "?fuzz_optional_import"]


class Reporter:
    """Writes events to the parent, one line each (atomic pipe writes)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.top: str | None = None
        self.stage_name = "start"
        self.failed_stage: str | None = None
        self.cleanup_errors: list[BaseException] = []

    def mark_failure(self) -> None:
        if self.failed_stage is None:
            self.failed_stage = self.stage_name

    def send(self, *parts) -> None:
        line = (" ".join(str(p) for p in parts) + "\n").encode()
        try:
            os.write(self.fd, line)
        except OSError:
            pass

    def stage(self, name: str) -> None:
        self.stage_name = name if self.top is None else f"{self.top}/{name}"
        self.send("S", self.stage_name)

    def resume(self) -> None:
        """A load finished: back to the enclosing user step, or ``loaded``."""
        if self.top is None:
            self.stage("loaded")
        elif self.stage_name != self.top:
            self.stage_name = self.top
            self.send("S", self.top)

    def enter(self, top: str) -> None:
        """A user-level step whose nested loader stages are sub-stages."""
        self.top = None
        self.stage(top)
        self.top = top


def preload() -> None:
    """Import, in the parent, every module a child uses: children are forked
    and then share one version of the code, whatever changes on disk during
    a run, and a case costs no imports."""
    import numpy  # noqa: F401

    import elfloader  # noqa: F401
    import elfloader.backend.emulated  # noqa: F401
    import elfloader.backend.native  # noqa: F401
    import fatelf  # noqa: F401
    import hal_cpu  # noqa: F401
    import hal_cpu.dispatch  # noqa: F401
    import hal_cpu.plugins  # noqa: F401
    import hal_cpu.programs.check  # noqa: F401
    import hal_cpu.programs.host_modules  # noqa: F401
    import hal_cpu.programs.vm.hal_module  # noqa: F401
    import hal_cpu.programs.vm.module_def  # noqa: F401
    import hal_cpu.programs.vm.program  # noqa: F401
    import hal_cpu.programs.vm.translate  # noqa: F401
    import hal_cpu.programs.vm.vmfb  # noqa: F401
    import hal_cpu.runtime  # noqa: F401


def instrument(rep: Reporter) -> None:
    """Wrap the library's classes (in this process) to report stages."""
    from elfloader import image as image_mod
    from elfloader import module as module_mod
    from elfloader.backend.emulated import EmulatedBackend
    from elfloader.backend.native import NativeBackend
    from hal_cpu import library, plugins

    def before(cls, name, stage, after=None):
        orig = getattr(cls, name, None)
        if orig is None:  # a step the library no longer has: report less
            return

        @functools.wraps(orig)
        def wrapper(self, *args, **kwargs):
            if stage:
                rep.stage(stage)
            result = orig(self, *args, **kwargs)
            if after:
                after(self)
            return result
        setattr(cls, name, wrapper)

    before(image_mod.ElfImage, "__init__", "verify")
    # A load nested in a user step (the runtime library loaded by the first
    # dispatch) hands the stage back to that step when it is done.
    before(module_mod.ElfModule, "__init__", "map", lambda self: rep.resume())

    orig_relocate = getattr(module_mod.ElfModule, "_relocate", None)
    if orig_relocate is not None:
        def relocate(self, *args, **kwargs):
            rep.send("M", hex(self.lo), hex(self.hi), self.name)
            rep.stage("relocate")
            return orig_relocate(self, *args, **kwargs)
        module_mod.ElfModule._relocate = relocate
    # After protection the loader runs the initializers.
    before(module_mod.ElfModule, "_protect", "map", lambda self: rep.stage("init"))
    before(library.Executable, "_query", "query")
    before(plugins.NativeAbiPlugin, "__init__", "query")

    for cls in (NativeBackend, EmulatedBackend):
        _wrap_calls(cls, rep)
    _wrap_spawn(rep)


def _wrap_spawn(rep: Reporter) -> None:
    """Report each guest agent process the qemu engine starts."""
    try:
        from elfloader.backend.emulated import sandbox
    except ImportError:
        return
    orig = getattr(sandbox, "spawn", None)
    if orig is None:
        return

    @functools.wraps(orig)
    def spawn(*args, **kwargs):
        proc = orig(*args, **kwargs)
        rep.send("P", proc.pid)
        return proc
    sandbox.spawn = spawn


def _wrap_calls(cls, rep: Reporter) -> None:
    orig_call, orig_function, orig_callback = cls.call, cls.function, cls.callback

    def call(self, address, *args):
        rep.send("G+", hex(address))
        try:
            return orig_call(self, address, *args)
        finally:
            rep.send("G-")

    def function(self, address, nargs):
        fn = orig_function(self, address, nargs)

        def guest(*args):
            rep.send("G+", hex(address))
            try:
                return fn(*args)
            finally:
                rep.send("G-")
        return guest

    orig_bound = cls.bound_calls

    def bound_calls(self, address, args):
        def wrap(fn):
            def guest():
                rep.send("G+", hex(address))
                try:
                    return fn()
                finally:
                    rep.send("G-")
            return guest
        return [wrap(fn) for fn in orig_bound(self, address, args)]

    def callback(self, fn, nargs):
        def host(*args):
            rep.send("C+")
            try:
                return fn(*args)
            finally:
                rep.send("C-")
        return orig_callback(self, host, nargs)

    cls.call, cls.function, cls.callback = call, function, callback
    cls.bound_calls = bound_calls


# --- the user's steps ------------------------------------------------------------
def _cleanup(rep: "Reporter", close) -> None:
    """Close after a failure, as a user's ``with`` block would; an error
    while closing is kept for the outcome."""
    rep.mark_failure()
    rep.enter("close")
    try:
        close()
    except BaseException as exc:
        rep.cleanup_errors.append(exc)


def run_executable(case, data, rep, opts):
    import numpy as np

    import hal_cpu
    kw = {"timeout": opts["emulated_call_timeout"]} if case["backend"] == "emulated" else {}
    ex = hal_cpu.Executable(data, backend=case["backend"], **kw)
    spec = opts["dispatch"]
    try:
        rep.enter("dispatch")
        bindings = []
        for i, (length, role) in enumerate(zip(spec["bindings"], spec["roles"])):
            a = np.zeros(length, np.uint8)
            if role == "input":
                a[:] = (np.arange(length) * (7 + i)) & 0x3F   # small finite floats
            bindings.append(a)
        ex.dispatch(0, tuple(spec["workgroup_count"]), bindings, list(spec["constants"]),
                    workers=1, timeout=opts["dispatch_timeout"])
    except BaseException:
        _cleanup(rep, ex.close)
        raise
    rep.enter("close")
    ex.close()


def run_plugin(case, data, rep, opts):
    from hal_cpu.plugins import PluginManager
    kw = {"timeout": opts["emulated_call_timeout"]} if case["backend"] == "emulated" else {}
    manager = PluginManager(case["arch"], case["backend"], **kw)
    try:
        manager.register_embedded(data)
        rep.enter("resolve")
        manager.resolve(PLUGIN_IMPORTS)
    except BaseException:
        _cleanup(rep, manager.close)
        raise
    rep.enter("close")
    manager.close()


def run_bundle(case, data, rep, opts):
    import elfloader
    import fatelf
    from hal_cpu import runtime
    rep.stage("parse")
    fatelf.FatElf.parse(data)
    elfloader.read_image(data, arch=case["arch"])
    if case["kind"] == "plugin-bundle":
        run_plugin(case, data, rep, opts)
        return
    kw = {"timeout": opts["emulated_call_timeout"]} if case["backend"] == "emulated" else {}
    module = elfloader.load(data, arch=case["arch"], backend=case["backend"], **kw)

    def close():
        try:
            module.close()
        finally:
            module.backend.close()
    try:
        rep.stage("query")
        loop = module.lookup(runtime.LOOP_SYMBOL)
        rep.enter("dispatch")
        ret = elfloader.as_int32(module.backend.call(loop, 0, 0, 0, 0, 0))
        if ret != runtime.LOOP_INVALID:
            rep.send("N", f"loop returned {ret} for NULL arguments")
    except BaseException:
        _cleanup(rep, close)
        raise
    rep.enter("close")
    close()


def _bindings(spec):
    import numpy as np
    bindings = []
    for i, (length, role) in enumerate(zip(spec["bindings"], spec["roles"])):
        a = np.zeros(length, np.uint8)
        if role == "input":
            a[:] = (np.arange(length) * (7 + i)) & 0x3F   # small finite floats
        bindings.append(a)
    return bindings


#: Threads dispatching at once in a ``threads`` case, and dispatches each.
THREADS, THREAD_DISPATCHES = 3, 20


def run_threads(case, data, rep, opts):
    """One executable, :data:`THREADS` threads dispatching export 0 (two
    workers each) while this thread closes it after ``close_after``
    seconds. Every thread must end with success or a typed error."""
    import threading
    import time

    import hal_cpu
    from fatelf import PortableKernelError
    kw = {"timeout": opts["emulated_call_timeout"]} if case["backend"] == "emulated" else {}
    ex = hal_cpu.Executable(data, backend=case["backend"], **kw)
    spec = opts["dispatch"]
    typed, escaped = [], []

    def work():
        bindings = _bindings(spec)
        for _ in range(THREAD_DISPATCHES):
            try:
                ex.dispatch(0, tuple(spec["workgroup_count"]), bindings,
                            list(spec["constants"]), workers=2,
                            timeout=opts["dispatch_timeout"])
            except hal_cpu.LibraryError:
                return                      # closed: the expected end
            except PortableKernelError as exc:
                typed.append(exc)
                return
            except BaseException as exc:  # noqa: BLE001 - an escape
                escaped.append(exc)
                return

    rep.enter("dispatch")
    threads = [threading.Thread(target=work, daemon=True) for _ in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(case.get("close_after", 0.01))
    rep.enter("close")
    try:
        ex.close()
    finally:
        for t in threads:
            t.join()
    if escaped:
        raise escaped[0]
    if typed:
        raise typed[0]


def run_files(case, data, rep, opts):
    """The executable given as a path of kind ``file_kind`` to every API
    that takes a path; each must finish at once with success or a typed
    error (a FIFO must not block, a device or a sparse file must not be
    read whole)."""
    import shutil
    import tempfile

    import elfloader
    import fatelf
    import hal_cpu
    from fatelf import PortableKernelError
    from hal_cpu.buffers import parse_binding
    from hal_cpu.plugins import PluginManager
    from hal_cpu.programs.vm import vmfb
    kind = case.get("file_kind", "plain")
    tmp = tempfile.mkdtemp(prefix="pkr-fuzz-")
    path = os.path.join(tmp, "input.so")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "device":
        path = "/dev/zero"
    else:
        with open(path, "wb") as f:
            f.write(data)
            if kind == "sparse":
                f.truncate(max(len(data), 8 << 30))
    kw = {"timeout": opts["emulated_call_timeout"]} if case["backend"] == "emulated" else {}
    first_typed = []

    def step(name, fn):
        rep.enter(name)
        try:
            fn()
        except PortableKernelError as exc:
            first_typed.append(exc)

    def executable():
        with hal_cpu.Executable(path, backend=case["backend"], **kw) as ex:
            ex.dispatch(0, tuple(opts["dispatch"]["workgroup_count"]),
                        _bindings(opts["dispatch"]), list(opts["dispatch"]["constants"]),
                        workers=1, timeout=opts["dispatch_timeout"])

    def plugin():
        with PluginManager(case["arch"], case["backend"], **kw) as manager:
            manager.register_embedded(path)

    try:
        step("verify", lambda: elfloader.read_image(path, arch=case["arch"]))
        step("dispatch", executable)
        step("resolve", plugin)
        step("parse", lambda: fatelf.read(path))
        step("parse", lambda: parse_binding(f"@{path}"))
        step("parse", lambda: parse_binding(f"16xf32=@{path}"))
        step("parse", lambda: vmfb.is_module_file(path))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if first_typed:
        raise first_typed[0]


def run_code(case, data, rep, opts):
    """An executable whose export 0 has hostile code, dispatched on the
    emulated backend (never natively: the code would run on this host)."""
    if case["backend"] != "emulated":
        raise SystemExit("the code target runs only on the emulated backend")
    delay = case.get("kill_host_after")
    if delay:
        # the host process dies mid-run, as a crashing or killed program
        # would: whatever the guest code did must end with it
        import signal
        import threading
        import time

        def die():
            time.sleep(delay)
            rep.send("K", rep.stage_name)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die, daemon=True).start()
    run_executable(case, data, rep, opts)


def run_vmfb(case, data, rep, opts):
    """A mutated ``.vmfb`` read by the VM module reader (see
    :func:`fuzz.vmfb.run`)."""
    from .vmfb import run as run_module_file
    run_module_file(case, data, rep, opts)


def run_program(case, data, rep, opts):
    """A mutated compiled program loaded and called (see
    :func:`fuzz.programs.run`)."""
    from .programs import run as run_compiled_program
    run_compiled_program(case, data, rep, opts)


def run_mlir(case, data, rep, opts):
    """Mutated program text compiled and run (see
    :func:`fuzz.programs.run_mlir`)."""
    from .programs import run_mlir as run_program_text
    run_program_text(case, data, rep, opts)


def run_vmfb_run(case, data, rep, opts):
    """A mutated compiled program loaded and run, its results checked for
    canary bytes (see :func:`fuzz.vmrun.run`)."""
    from .vmrun import run as run_mutated_program
    run_mutated_program(case, data, rep, opts)


def run_names(case, data, rep, opts):
    """A compiled program with mutated names, run and printed (see
    :func:`fuzz.vmrun.run_names`)."""
    from .vmrun import run_names as run_named
    run_named(case, data, rep, opts)


RUNNERS = {"code": run_code, "vmfb-run": run_vmfb_run, "names": run_names,
           "elf": run_executable, "plugin": run_plugin, "fatelf": run_bundle,
           "threads": run_threads, "files": run_files, "vmfb": run_vmfb,
           "program": run_program, "mlir": run_mlir}


def _frames(tb, limit=12):
    return [f"{os.path.relpath(f.filename) if f.filename.startswith(os.getcwd()) else f.filename}"
            f":{f.lineno} in {f.name}" for f in traceback.extract_tb(tb)[-limit:]]


def describe_error(exc: BaseException) -> dict:
    value = getattr(exc, "value", None)
    out = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:500],
        "field": getattr(exc, "field", None),
        "value": repr(value)[:200] if value is not None else None,
        "traceback": _frames(exc.__traceback__),
    }
    # an emulated CPU's fault: its kind, and the system call it made
    from elfloader import EmulationError
    fault = exc.fault if isinstance(exc, EmulationError) else None
    if fault is not None:
        out["fault"] = fault.kind
        if fault.kind == "syscall":
            out["syscall"] = fault.syscall
            out["syscall_name"] = fault.syscall_name
    m = _RETURNED.search(out["message"])
    if m and out["field"] == "workgroup_id":
        out["status"] = int(m.group(1))
    return out


_RETURNED = re.compile(r" returned (-?\d+) in workgroup ")


def engine_of(arch: str) -> str | None:
    """The engine an emulated backend of ``arch`` gets here (``auto``:
    ``$PKR_ENGINE``, else qemu-user where it can run)."""
    try:
        import elfloader
        from elfloader.backend.emulated import choice
        return choice.choose(elfloader.arch.by_name(arch))
    except Exception as exc:  # noqa: BLE001 - only a label
        return f"? ({type(exc).__name__})"


def run(case: dict, data: bytes, rep: Reporter, opts: dict) -> dict:
    """Run one case in this process; returns the outcome record."""
    from fatelf import PortableKernelError

    from .vmrun import OutOfBufferRead
    engine = None
    if case["target"] == "code":
        engine = engine_of(case["arch"])
    try:
        RUNNERS[case["target"]](case, data, rep, opts)
        result = {"outcome": "accepted", "stage": rep.stage_name}
    except PortableKernelError as exc:
        result = {"outcome": "typed", "error": describe_error(exc)}
    except OutOfBufferRead as exc:
        result = {"outcome": "oob", "error": describe_error(exc)}
    except MemoryError as exc:
        result = {"outcome": "blowup", "reason": "MemoryError", "error": describe_error(exc)}
    except BaseException as exc:  # everything else escaped the error contract
        result = {"outcome": "escape", "error": describe_error(exc)}
    if result["outcome"] != "accepted":
        result["stage"] = rep.failed_stage or rep.stage_name
    if engine is not None:
        result["engine"] = engine
    for exc in rep.cleanup_errors:
        if isinstance(exc, MemoryError) and result["outcome"] in ("accepted", "typed"):
            result.update(outcome="blowup", reason="MemoryError while closing",
                          stage="close", error=describe_error(exc))
        elif not isinstance(exc, PortableKernelError) and \
                result["outcome"] in ("accepted", "typed"):
            result.update(outcome="escape", stage="close", error=describe_error(exc),
                          note="raised while closing after an earlier error")
        else:
            result.setdefault("cleanup_errors", []).append(describe_error(exc))
    return result


def child_main(case: dict, data: bytes, fd: int, opts: dict) -> None:
    """Entry point of a forked child; never returns."""
    code = 0
    try:
        limit = opts.get("address_space")
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        devnull = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(devnull, std)
        faulthandler.enable(file=fd, all_threads=True)
        if opts.get("timeout"):
            faulthandler.dump_traceback_later(max(0.5, opts["timeout"] * 0.9), file=fd)
        rep = Reporter(fd)
        instrument(rep)
        result = run(case, data, rep, opts)
        faulthandler.cancel_dump_traceback_later()
        try:
            result["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        except OSError:     # a confined child may not ask (the parent's wait4 tells)
            pass
        rep.send("R", json.dumps(result))
    except BaseException:
        code = 70
        try:
            os.write(fd, ("X " + traceback.format_exc().replace("\n", "\\n") + "\n").encode())
        except OSError:
            pass
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(code)
