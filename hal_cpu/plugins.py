"""Executable plugins and the plugin manager.

A plugin provides the functions that executables import
(iree/hal/local/executable_plugin.h, v0.1): ``iree_hal_executable_plugin_query``
returns a header (version, name, description, features, sanitizer) and the
``load``/``unload``/``resolve`` entry points. Three kinds are supported:

* embedded ELF (``x.sos``, ``embedded:x.so``): loaded by :mod:`elfloader`
  into the manager's backend, natively or emulated;
* system library (any other path): loaded with the platform's loader through
  ctypes, host architecture only;
* Python: a mapping of import names to callables ``fn(params, context) ->
  int``, where ``params`` is a :class:`ParamsView` of the guest memory.

:class:`PluginManager` keeps registration order and resolves imports newest
registration first; names starting with ``?`` are optional and resolve to
NULL with the MISSING_OPTIONAL bit, as IREE's
``executable_plugin_manager.c`` does.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Mapping, Sequence, cast
from urllib.parse import parse_qsl

import elfloader
from elfloader import Backend, open_backend
from fatelf.cstruct import unpack_array
from fatelf.files import open_regular
from fatelf.text import printable

from . import abi
from .errors import PluginError, PluginSpecError, PluginStatusError, UnresolvedImportError
from .memory import GuestMemory, GuestView, ptr_array


# --- specs -------------------------------------------------------------------
class PluginSpec:
    """A parsed ``--executable_plugin`` value.

    ``path.sos`` or ``embedded:path`` -> kind ``embedded``; any other path ->
    kind ``system``. A ``?key=value&k2=v2`` suffix gives load parameters
    (percent-decoded).

    Raises:
        PluginSpecError: empty path or a malformed parameter list.
    """

    def __init__(self, text: str):
        self.text = text
        body = text
        self.kind = "system"
        if body.startswith("embedded:"):
            self.kind, body = "embedded", body[len("embedded:"):]
        path, sep, query = body.partition("?")
        if path.endswith(".sos"):
            self.kind = "embedded"
        if not path:
            raise PluginSpecError("no plugin path", name=repr(text),
                                  field="path", value=text)
        self.path = path
        self.params: list[tuple[str, str]] = []
        if sep:
            try:
                self.params = parse_qsl(query, keep_blank_values=True,
                                        strict_parsing=True)
            except ValueError:
                raise PluginSpecError(
                    f"malformed parameters {query!r}; expected "
                    "key=value&key2=value2", name=repr(text), field="params",
                    value=query) from None

    def __repr__(self):
        return f"PluginSpec({self.kind}, {self.path!r}, {self.params})"


# --- the Python side of guest memory ----------------------------------------
class ParamsView(GuestMemory):
    """Readable/writable view of an import's params struct (and anything it
    points to) in the backend's memory: :class:`GuestMemory` with offsets
    relative to the struct.

    Attributes:
        address: guest address of the params struct.
        pointer_size: 4 or 8; ``size_t`` and pointers have this width.
    """

    def __init__(self, backend: Backend, address: int):
        super().__init__(backend)
        self.address = address

    def read(self, offset: int, size: int, what: str = "params") -> bytes:
        """``size`` bytes at ``offset`` in the params struct."""
        return self.backend.read(self.address + offset, size)

    def write(self, offset: int, data) -> None:
        """Write bytes (or a numpy array's bytes) at ``offset`` in the
        params struct."""
        super().write(self.address + offset, data)

    def struct(self, cstruct, offset: int = 0, what: str = "params") -> dict:
        """Fields of the params struct described by ``cstruct`` (a
        :class:`CStruct` laid out for this backend's pointer width, or a
        numpy structured dtype), as a dict."""
        return super().struct(cstruct, offset, what)

    def array(self, address: int, dtype, count):
        """A numpy array: a copy of ``count`` elements (or a shape) of
        ``dtype`` at guest ``address``."""
        return GuestMemory(self.backend).numpy(address, dtype, count)

    def store(self, address: int, array) -> None:
        """Write a numpy array's bytes at guest ``address``."""
        GuestMemory(self.backend).write(address, array)


# --- host allocator ----------------------------------------------------------
class HostAllocator:
    """``iree_hal_executable_plugin_allocator_t`` served from the backend:
    MALLOC/CALLOC/REALLOC/FREE through one C-callable ``ctl`` function."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.sizes: dict[int, int] = {}
        self.ctl = backend.callback(self._ctl, 4)
        layout = abi.PLUGIN_ENVIRONMENT.layout(*backend.arch.c_abi)
        self.environment = backend.alloc_bytes(layout.pack(**{
            "host_allocator.self": 0, "host_allocator.ctl": self.ctl}))

    def _ctl(self, _self, command, params, inout_ptr) -> int:
        be, ps = self.backend, self.backend.pointer_size
        old = unpack_array("ptr", ps, be.read(inout_ptr, ps))[0]
        if command == abi.ALLOCATOR_FREE:
            if old in self.sizes:
                del self.sizes[old]
                be.release(old)
            return 0
        if command not in (abi.ALLOCATOR_MALLOC, abi.ALLOCATOR_CALLOC,
                           abi.ALLOCATOR_REALLOC) or not params:
            return abi.STATUS_CODES.index("INVALID_ARGUMENT")
        layout = abi.ALLOC_PARAMS.layout(*be.arch.c_abi)
        size = layout.unpack(be.read(params, layout.size))["byte_length"]
        if size > 1 << 30:
            return abi.STATUS_CODES.index("RESOURCE_EXHAUSTED")
        new = be.alloc(max(size, 1))
        self.sizes[new] = size
        if command == abi.ALLOCATOR_REALLOC and old in self.sizes:
            keep = min(size, self.sizes.pop(old))
            be.write(new, be.read(old, keep))
            be.release(old)
        be.write(inout_ptr, ptr_array(ps, [new]))
        return 0

    def close(self) -> None:
        for addr in list(self.sizes):
            self.backend.release(addr)
        self.sizes.clear()
        self.backend.release(self.environment)


# --- plugins -------------------------------------------------------------------
class Plugin:
    """A registered plugin. Attributes: ``name``, ``kind``, ``description``,
    ``version``, ``features``, ``sanitizer``, ``params`` (load parameters)."""

    kind = "?"
    name = description = ""
    version = features = 0
    sanitizer = "none"

    def resolve_into(self, batch: "ResolveBatch") -> tuple[int, int]:
        """Fill unresolved entries of ``batch``; returns (status code,
        resolution bits), as ``iree_hal_executable_plugin_resolve`` does."""
        raise NotImplementedError

    def unload(self) -> None:
        pass

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r} ({self.kind})>"


class ResolveBatch:
    """Guest arrays for resolve calls: symbol names, out_fn_ptrs and
    out_fn_contexts (iree_hal_executable_plugin_resolve_params_v0_t).
    Use as a context manager; :meth:`read` gives (fns, contexts)."""

    def __init__(self, backend: Backend, names: Sequence[str]):
        self.backend, self.names = backend, list(names)
        ps = backend.pointer_size
        self.strings = [backend.alloc_bytes(n.encode() + b"\0") for n in names]
        n = len(names)
        self.names_addr = backend.alloc_bytes(ptr_array(ps, self.strings))
        self.fns_addr = backend.alloc_bytes(bytes(ps * n))
        self.ctx_addr = backend.alloc_bytes(bytes(ps * n))

    def read(self) -> tuple[list[int], list[int]]:
        ps, n = self.backend.pointer_size, len(self.names)
        return (unpack_array("ptr", ps, self.backend.read(self.fns_addr, ps * n)),
                unpack_array("ptr", ps, self.backend.read(self.ctx_addr, ps * n)))

    def write(self, fns: list[int], ctx: list[int]) -> None:
        ps = self.backend.pointer_size
        self.backend.write(self.fns_addr, ptr_array(ps, fns))
        self.backend.write(self.ctx_addr, ptr_array(ps, ctx))

    def free(self) -> None:
        for a in self.strings + [self.names_addr, self.fns_addr, self.ctx_addr]:
            self.backend.release(a)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class NativeAbiPlugin(Plugin):
    """A plugin whose code speaks the C ABI: embedded ELF or system library.

    Queries the plugin, checks its version, loads it with the manager's host
    allocator and parameters, and calls its ``resolve``/``unload``.
    """

    def __init__(self, manager: "PluginManager", query: int, label: str,
                 params: Sequence[tuple[str, str]], view: GuestView):
        self.manager, self.label, self.params = manager, label, list(params)
        self.self_ptr: int | None = None
        result = self._call(query, "query", abi.PLUGIN_VERSION, 0)
        if result == 0:
            raise PluginError(f"{abi.PLUGIN_QUERY} returned NULL for version "
                              f"{abi.PLUGIN_VERSION:#x}", name=label,
                              field="max_version", value=abi.PLUGIN_VERSION)
        lib = view.struct(abi.PLUGIN_V0, result, "plugin")
        header = view.struct(abi.PLUGIN_HEADER, lib["header"], "plugin.header")
        self.version = header["version"]
        if self.version > abi.PLUGIN_VERSION:
            raise PluginError(f"plugin version {self.version:#x} is newer than "
                              f"the supported version {abi.PLUGIN_VERSION:#x}",
                              name=label, field="header.version",
                              value=self.version)
        self.name = view.string(header["name"], "header.name") or label
        self.description = view.string(header["description"],
                                       "header.description") or ""
        self.features = header["features"]
        self.sanitizer = abi.SANITIZERS.get(header["sanitizer"],
                                            str(header["sanitizer"]))
        for fn in ("load", "unload", "resolve"):
            if lib[fn]:
                view.check_code(lib[fn], f"plugin.{fn}")
        if not lib["resolve"]:
            raise PluginError("plugin has no resolve function", name=label,
                              field="plugin.resolve", value=0)
        self._unload, self._resolve = lib["unload"], lib["resolve"]
        self._load(lib["load"])


    def _call(self, function: int, what: str, *args: int) -> int:
        """Call one of the plugin's functions (``what``: ``query``,
        ``load``, ``resolve``, ``unload``). An emulated fault becomes the
        fault report against the plugin (see
        :func:`hal_cpu.faults.call_fault`)."""
        try:
            return self.manager.backend.call(function, *args)
        except elfloader.EmulationError as exc:
            module = getattr(self, "module", None)
            if module is None:
                raise
            from .faults import call_fault
            others = [m for m in (getattr(p, "module", None)
                                  for p in self.manager.plugins)
                      if m is not None]
            raise call_fault(exc, self.manager.backend, [module] + others,
                             f"{abi.PLUGIN_QUERY if what == 'query' else what}"
                             f" of plugin {self.label}",
                             "plugin function") from None

    def _load(self, load_fn: int) -> None:
        be, ps = self.manager.backend, self.manager.backend.pointer_size
        temps = []

        def keep(data):
            temps.append(be.alloc_bytes(data))
            return temps[-1]

        try:
            pair = abi.STRING_PAIR.layout(*be.arch.c_abi)
            pairs = b"".join(pair.pack(**{
                "key.data": keep(k.encode() + b"\0"), "key.size": len(k.encode()),
                "value.data": keep(v.encode() + b"\0"), "value.size": len(v.encode())})
                for k, v in self.params)
            pairs_addr = keep(pairs) if pairs else 0
            out_self = keep(bytes(ps))
            if load_fn:
                detail = ("; parameters " + "&".join(f"{k}={v}" for k, v in self.params)
                          if self.params else "")
                PluginStatusError.check(
                    self._call(load_fn, "load",
                               self.manager.allocator.environment,
                               len(self.params), pairs_addr, out_self),
                    "load", self.label, detail)
            self.self_ptr = unpack_array("ptr", ps, be.read(out_self, ps))[0]
        finally:
            for a in temps:
                be.release(a)

    def resolve_into(self, batch):
        be = self.manager.backend
        params = be.alloc_bytes(abi.RESOLVE_PARAMS.layout(*be.arch.c_abi).pack(
            count=len(batch.names), symbol_names=batch.names_addr,
            out_fn_ptrs=batch.fns_addr, out_fn_contexts=batch.ctx_addr))
        out = be.alloc_bytes(bytes(4))
        try:
            # (loaded: the plugin's self pointer is set)
            status = self._call(self._resolve, "resolve",
                                cast(int, self.self_ptr), params, out)
            resolution = unpack_array("u32", 4, be.read(out, 4))[0]
        finally:
            be.release(params)
            be.release(out)
        return status & abi.PLUGIN_STATUS_CODE_MASK, resolution

    def unload(self) -> None:
        if self.self_ptr is not None and self._unload:
            ptr, self.self_ptr = self.self_ptr, None
            self._call(self._unload, "unload", ptr)


class EmbeddedPlugin(NativeAbiPlugin):
    """A plugin ELF/FatELF loaded by :mod:`elfloader` into the manager's
    backend (native or emulated)."""

    kind = "embedded"

    def __init__(self, manager, source, params=()):
        self.module = elfloader.load(source, backend=manager.backend)
        try:
            m = self.module
            view = GuestView(manager.backend, m, m.name, PluginError)
            query = m.lookup(abi.PLUGIN_QUERY)
            view.check_code(query, abi.PLUGIN_QUERY)
            super().__init__(manager, query, m.name, params, view)
        except BaseException:
            self.module.close()
            raise

    def unload(self) -> None:
        try:
            super().unload()
        finally:
            self.module.close()


def _embedded_hint(path) -> str:
    """A hint when a file given as a system library is an embedded ELF."""
    try:
        fd, _ = open_regular(path, PluginError)
        with os.fdopen(fd, "rb") as f:
            head = f.read(4)
    except (OSError, PluginError):
        return ""
    import fatelf
    if fatelf.is_fatelf(head):
        return "; it is a FatELF bundle: pass it as embedded:PATH or name it .sos"
    if head == b"\x7fELF":
        try:
            elfloader.read_image(path)
        except elfloader.ElfError:
            return ""
        return ("; it is an embedded ELF (self-contained, no DT_NEEDED): pass "
                "it as embedded:PATH or name it .sos")
    return ""


class SystemPlugin(NativeAbiPlugin):
    """A host shared library loaded with the platform's loader (ctypes);
    runs only with the native backend."""

    kind = "system"

    def __init__(self, manager, path, params=()):
        if manager.backend.kind != "native":
            raise PluginError(
                f"system library plugins run on the host only; this manager "
                f"runs {manager.backend.arch.name} code emulated (use an "
                f"embedded .sos plugin instead)", name=os.fspath(path),
                field="kind", value="system")
        # The platform's loader would block on a FIFO and read a device
        # forever: regular files only.
        fd, _ = open_regular(path, PluginError, field="path")
        os.close(fd)
        try:
            self.lib = ctypes.CDLL(os.path.abspath(os.fspath(path)))
            query = ctypes.cast(getattr(self.lib, abi.PLUGIN_QUERY),
                                ctypes.c_void_p).value
        except OSError as exc:
            raise PluginError(f"cannot load system library: {exc}"
                              + _embedded_hint(path), name=os.fspath(path),
                              field="path", value=os.fspath(path)) from None
        except AttributeError:
            raise PluginError(f"no exported {abi.PLUGIN_QUERY}",
                              name=os.fspath(path), field="symbol",
                              value=abi.PLUGIN_QUERY) from None
        # A system library lives anywhere in the process; no range to check.
        view = GuestView(manager.backend, None, os.fspath(path), PluginError)
        # (the exported query's address: not NULL)
        super().__init__(manager, cast(int, query), os.fspath(path), params,
                         view)


class PythonPlugin(Plugin):
    """Imports implemented in Python, callable from native or emulated code.

    Args:
        functions: import name -> ``fn(params: ParamsView, context: int) ->
            int`` (0 for success).
        name: plugin name for messages.
        context: value passed as each import's context.
    """

    kind = "python"

    def __init__(self, manager, functions: Mapping[str, Callable], name="python",
                 context: int = 0):
        self.name, self.description = name, "Python callables"
        self.version = abi.PLUGIN_VERSION
        self.params: list[tuple[str, str]] = []
        be = manager.backend
        self.context = context
        self.pointers = {}
        for sym, fn in functions.items():
            if not callable(fn):
                raise PluginError(f"{sym!r} is not callable", name=name,
                                  field="functions", value=sym)
            self.pointers[sym] = be.callback(self._wrap(be, fn), 3)

    @staticmethod
    def _wrap(backend, fn):
        def call(params, context, _reserved):
            return fn(ParamsView(backend, params), context)
        return call

    def resolve_into(self, batch):
        fns, ctx = batch.read()
        resolution, missing = 0, False
        for i, name in enumerate(batch.names):
            if fns[i]:
                continue
            optional = name.startswith("?")
            ptr = self.pointers.get(name[1:] if optional else name)
            if ptr:
                fns[i], ctx[i] = ptr, self.context
            elif optional:
                resolution |= abi.PLUGIN_RESOLUTION_MISSING_OPTIONAL
            else:
                missing = True
        batch.write(fns, ctx)
        return (abi.STATUS_CODES.index("NOT_FOUND") if missing else 0), resolution


# --- manager -------------------------------------------------------------------
class PluginManager:
    """Registered plugins sharing one backend.

    Args:
        arch: architecture of the executables to serve (name or Arch; None:
            host).
        backend: ``"auto"``/``"native"``/``"emulated"`` or a Backend.
        options: for a new emulated backend: ``engine``, ``cpu`` (CPU
            profile), ``vlen`` (bits), ``timeout`` (see
            :func:`elfloader.open_backend`).

    Raises:
        elfloader.ArchitectureMismatchError: native for a foreign arch.
        elfloader.EngineError: the engine cannot run the CPU profile.
    """

    def __init__(self, arch=None, backend="auto", **options):
        self._owns = not isinstance(backend, Backend)
        self.backend = backend if not self._owns else open_backend(arch, backend,
                                                                   **options)
        self.allocator = HostAllocator(self.backend)
        self.plugins: list[Plugin] = []

    @classmethod
    def from_specs(cls, specs: Sequence[str], arch=None, backend="auto",
                   timeout: float | None = None, **options):
        """A manager with each ``--executable_plugin`` spec registered in
        order (``options`` as for the constructor); each guest call while
        loading (initializers, query, load) is limited to ``timeout``
        seconds on an emulated backend (default
        :data:`hal_cpu.library.LOAD_TIMEOUT`; 0: none)."""
        from .dispatch_policy import check_timeout
        from .library import LOAD_TIMEOUT
        timeout = check_timeout(LOAD_TIMEOUT if timeout is None else timeout,
                                "timeout", None, PluginError)
        parsed = [PluginSpec(s) for s in specs]
        manager = cls(arch, backend, **options)
        try:
            with manager.backend.time_limit(timeout):
                for spec in parsed:
                    manager.register_spec(spec)
        except BaseException:
            manager.close()
            raise
        return manager

    def _register(self, make) -> Plugin:
        plugin = make()
        self.plugins.append(plugin)
        return plugin

    def register_spec(self, spec: str | PluginSpec) -> Plugin:
        """Register a plugin from a spec string (see :class:`PluginSpec`)."""
        if isinstance(spec, str):
            spec = PluginSpec(spec)
        if spec.kind == "embedded":
            return self.register_embedded(spec.path, spec.params)
        return self.register_system(spec.path, spec.params)

    def register_embedded(self, source, params: Sequence[tuple[str, str]] = ()):
        """Load an embedded ELF/FatELF plugin (path or bytes)."""
        return self._register(lambda: EmbeddedPlugin(self, source, params))

    def register_system(self, path, params: Sequence[tuple[str, str]] = ()):
        """Load a host shared library plugin (native backend only)."""
        return self._register(lambda: SystemPlugin(self, path, params))

    def register_python(self, functions: Mapping[str, Callable],
                        name: str = "python", context: int = 0):
        """Register Python callables as imports."""
        return self._register(lambda: PythonPlugin(self, functions, name, context))

    def resolve(self, names: Sequence[str]) -> tuple[list[int], list[int]]:
        """Function pointers and contexts for import ``names``.

        Scans plugins newest registration first; a plugin answering OK ends
        the scan unless it reports MISSING_OPTIONAL; NOT_FOUND moves on.

        Raises:
            UnresolvedImportError: required names nobody provides (all listed,
                with the plugins searched).
            PluginStatusError: a plugin's resolve failed otherwise.
        """
        if not names:
            return [], []
        with ResolveBatch(self.backend, names) as batch:
            all_required = False
            for plugin in reversed(self.plugins):
                code, resolution = plugin.resolve_into(batch)
                if code == 0:
                    all_required = True
                    if resolution & abi.PLUGIN_RESOLUTION_MISSING_OPTIONAL:
                        continue
                    break
                if abi.status_name(code) != "NOT_FOUND":
                    PluginStatusError.check(code, "resolve",
                                            printable(plugin.name, 200))
            fns, ctx = batch.read()
        missing = [n for n, f in zip(names, fns) if not f and not n.startswith("?")]
        if missing or (not all_required and any(not n.startswith("?") for n in names)):
            searched = [p.name for p in reversed(self.plugins)]
            raise UnresolvedImportError(
                f"missing required imports {printable(', '.join(missing))}; "
                f"searched {printable(', '.join(searched)) or 'no plugins'}",
                field="imports",
                value=missing, missing=missing, searched=searched)
        return fns, ctx

    def provider(self, name: str) -> Plugin | None:
        """The plugin :meth:`resolve` takes import ``name`` from (newest
        registration first), or None when no plugin provides it."""
        with ResolveBatch(self.backend, [name]) as batch:
            for plugin in reversed(self.plugins):
                plugin.resolve_into(batch)
                if batch.read()[0][0]:
                    return plugin
        return None

    def unregister(self, plugin: Plugin) -> None:
        self.plugins.remove(plugin)
        plugin.unload()

    def close(self) -> None:
        """Unload every plugin, newest first, and release the backend if the
        manager created it."""
        while self.plugins:
            self.plugins.pop().unload()
        self.allocator.close()
        if self._owns:
            self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def inspect_plugin(path, *, arch=None, backend="auto", resolve=(),
                   system: bool = False, timeout: float = 0) -> str:
    """Text describing a plugin (embedded, or a host system library when
    ``system``) and how it resolves the names in ``resolve``; each guest
    call is limited to ``timeout`` seconds on an emulated backend (0:
    none)."""
    if system:
        arch = elfloader.arch.host()
    else:
        arch = elfloader.read_image(path, arch=arch).arch
    with PluginManager(arch, "native" if system else backend) as manager, \
            manager.backend.time_limit(timeout):
        plugin = (manager.register_system(path) if system
                  else manager.register_embedded(path))
        lines = [
            f"file:         {path}",
            f"kind:         {plugin.kind}",
            f"architecture: {arch.name} ({manager.backend.kind})",
            f"plugin:       {printable(plugin.name, 200)} (version "
            f"{plugin.version:#x})",
            f"description:  {printable(plugin.description)}",
            f"features:     {plugin.features:#x}"
            + "".join(f" {n}" for bit, n in ((abi.PLUGIN_FEATURE_STANDALONE,
                                             "STANDALONE"),
                                            (abi.PLUGIN_FEATURE_FULL_STATUS,
                                             "FULL_STATUS"))
                      if plugin.features & bit),
            f"sanitizer:    {plugin.sanitizer}",
        ]
        if resolve:
            lines.append("resolve:")
            with ResolveBatch(manager.backend, resolve) as batch:
                code, resolution = plugin.resolve_into(batch)
                fns, ctx = batch.read()
            lines.append(f"  status {abi.status_name(code)}, resolution "
                         f"{resolution:#x}")
            for n, f, c in zip(resolve, fns, ctx):
                lines.append(f"  {printable(n, 200)}: "
                             + (f"fn={f:#x} context={c:#x}" if f
                                else "unresolved"))
        return "\n".join(lines)


def describe_system_library(path) -> str:
    """Text describing a system library (linked against the platform's
    libraries) from what its file says: architecture, ``DT_SONAME``,
    ``DT_NEEDED``, ``DT_RPATH``/``DT_RUNPATH`` and the symbols it exports,
    and whether it exports the plugin query. The file is read, never
    loaded: nothing of it runs.

    Raises:
        PluginError: the file cannot be read or its ELF structures are
            malformed.
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.enums import ENUM_E_MACHINE

    name = os.fspath(path)
    fd, _ = open_regular(path, PluginError, field="path")
    try:
        with os.fdopen(fd, "rb") as f:
            fd = -1
            elf = ELFFile(f)
            machine = elf.header["e_machine"]
            if isinstance(machine, str):
                machine = ENUM_E_MACHINE.get(machine, machine)
            arch = (elfloader.arch.by_elf(machine, elf.elfclass)
                    if isinstance(machine, int) else None)
            tags: dict[str, list] = {}
            exports: list[tuple[str, str]] = []
            segment: Any        # (a DynamicSegment where it is PT_DYNAMIC)
            for segment in elf.iter_segments():
                if segment["p_type"] != "PT_DYNAMIC":
                    continue
                for tag in segment.iter_tags():
                    if tag.entry.d_tag in ("DT_NEEDED", "DT_SONAME", "DT_RPATH",
                                           "DT_RUNPATH"):
                        value = getattr(tag, tag.entry.d_tag[3:].lower(), None)
                        tags.setdefault(tag.entry.d_tag, []).append(
                            value.decode("utf-8", "replace")
                            if isinstance(value, bytes) else str(value))
                for sym in segment.iter_symbols():
                    if (sym.name and sym["st_shndx"] != "SHN_UNDEF"
                            and sym["st_info"]["bind"] in ("STB_GLOBAL",
                                                           "STB_WEAK")
                            and sym["st_other"]["visibility"] in (
                                "STV_DEFAULT", "STV_PROTECTED")):
                        exports.append((sym.name,
                                        sym["st_info"]["type"][4:].lower()))
                break
    except (ELFError, ValueError, KeyError, AttributeError, IndexError,
            OSError, UnicodeDecodeError) as exc:
        raise PluginError(f"cannot read its ELF structures: "
                          f"{printable(str(exc))}", name=name,
                          field="path", value=name) from None
    finally:
        if fd >= 0:
            os.close(fd)
    exports = sorted(set(exports))
    where = (f"{arch.name} ({arch.elf_class}-bit)" if arch else
             f"e_machine {machine} ({elf.elfclass}-bit), not one "
             "this runtime runs")
    host = elfloader.arch.host()
    if arch is not None and host is not None and arch.name != host.name:
        where += f", not this host's {host.name}: it cannot be loaded here"
    has_query = any(n == abi.PLUGIN_QUERY for n, _ in exports)
    lines = [f"file:         {name}",
             "kind:         system library (linked against the platform's "
             "libraries)",
             f"architecture: {where}"]
    for tag in ("DT_SONAME", "DT_RUNPATH", "DT_RPATH"):
        for value in tags.get(tag, ()):
            lines.append(f"{tag[3:].lower() + ':':14}{printable(value)}")
    needed = tags.get("DT_NEEDED", [])
    lines.append(f"needed:       {len(needed)} (DT_NEEDED)")
    lines += [f"  {printable(n)}" for n in needed]
    lines.append(f"plugin query: {abi.PLUGIN_QUERY} "
                 + ("exported" if has_query else
                    "NOT exported: not an executable plugin"))
    lines.append(f"exports:      {len(exports)}")
    lines += [f"  {printable(n)}  ({kind})" for n, kind in exports]
    return "\n".join(lines)


def sandbox_for(paths: Sequence) -> Callable[[int], None]:
    """A ``confine`` for :func:`hal_cpu.isolate.run_in_child` that confines
    the child before a system library runs in it
    (:func:`elfloader.backend.emulated.sandbox.confine_native`): its files
    made, changed or removed, programs started, sockets, signals to other
    processes and ``ptrace`` are refused; it reads only the platform's
    libraries, Python's and this runtime's modules and the directories of
    ``paths`` (the libraries to load).

    Raises:
        PluginError: this machine cannot make the sandbox (no seccomp).
    """
    from elfloader.backend.emulated import sandbox

    from . import library  # noqa: F401 - imported while files can be read
    problem = sandbox.status()["problem"]
    if problem:
        raise PluginError(f"cannot confine a system library here: {problem}; "
                          "--run_native runs it unconfined",
                          name=os.fspath(paths[0]) if paths else None,
                          field="sandbox", value="seccomp")
    import sys

    import fatelf
    # The libraries' directories, and Python's and this runtime's modules
    # (imported on first use).
    dirs = {os.path.dirname(os.path.realpath(os.fspath(p))) for p in paths}
    for m in (elfloader, fatelf, sys.modules[__package__]):
        dirs.add(os.path.dirname(os.path.dirname(os.path.realpath(
            cast(str, m.__file__)))))
    dirs |= {os.path.dirname(os.path.realpath(os.__file__))}
    read = tuple(sorted(dirs))

    def confine(fd: int) -> None:
        sandbox.confine_native(keep=(fd,), read=read)
    return confine
