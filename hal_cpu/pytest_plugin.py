"""A pytest plugin for plugin and kernel authors: test on six architectures.

Installed with the package (entry point ``pytest11``), it adds:

* ``--hal-arch=all|host|x86_64,riscv64,...`` (default ``all``): the
  architectures the ``hal_arch`` fixture is parametrized over; aliases are
  accepted (``arm64``, ``rv32``...). ``--hal-backend=auto|emulated|native``.
* ``hal_arch``: the name of the architecture of the current test.
* ``hal_plugin(spec)``: loads a plugin (``.sos`` bundle or a
  per-architecture ``.so``, with optional ``?key=value`` load parameters) for
  the current architecture and returns a :class:`LoadedPlugin`, whose import
  functions are called by name with a params struct described once (a
  :class:`fatelf.cstruct.CStruct` or a numpy structured dtype) and numpy
  arrays placed in guest memory.
* ``hal_executable(path)``: a :class:`hal_cpu.Executable` for the current
  architecture and backend.

Failures inside guest code raise the backend's typed errors
(:class:`elfloader.EmulationError` under emulation), whose message is the
fault report.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pytest

from fatelf import arches
from fatelf.cstruct import CStruct

def pytest_addoption(parser):
    group = parser.getgroup("hal-cpu", "IREE CPU kernels on several architectures")
    group.addoption("--hal-arch", default="all", metavar="ARCHES",
                    help="architectures for the hal_arch fixture: all, host, or "
                         "a comma-separated list (aliases accepted)")
    group.addoption("--hal-backend", default="auto",
                    choices=("auto", "emulated", "native"),
                    help="backend for hal_plugin/hal_executable (default auto: "
                         "native for the host architecture)")


def selected_arches(text: str) -> list[str]:
    """Architecture names for a ``--hal-arch`` value.

    Raises:
        pytest.UsageError: an unknown name.
    """
    names: list[str] = []
    try:
        for token in (t.strip() for t in text.split(",") if t.strip()):
            if token == "all":
                picked = list(arches.RUNTIME_ARCHES)
            elif token == "host":
                picked = [arches.host_arch()]
            else:
                picked = [arches.lookup(token, runtime=True).name]
            names += [n for n in picked if n not in names]
    except arches.FatElfSelectError as exc:
        raise pytest.UsageError(f"--hal-arch: {exc.message}") from None
    return names


def pytest_generate_tests(metafunc):
    if "hal_arch" in metafunc.fixturenames:
        names = selected_arches(metafunc.config.getoption("--hal-arch"))
        metafunc.parametrize("hal_arch", names, ids=names)


class LoadedPlugin:
    """A plugin loaded into its own backend for one architecture.

    Attributes:
        manager: the :class:`hal_cpu.plugins.PluginManager` holding it.
        plugin: the registered plugin (name, description, features...).
        backend: its backend (memory of the guest).
    """

    def __init__(self, spec: str, arch: str, backend: str):
        from .plugins import PluginManager, PluginSpec
        self.manager = PluginManager(arch, backend)
        self.backend = self.manager.backend
        self._allocs: list[int] = []
        try:
            parsed = PluginSpec(spec)
            if parsed.kind != "embedded" and parsed.path.endswith(".so"):
                parsed = PluginSpec("embedded:" + spec)
            self.plugin = self.manager.register_spec(parsed)
        except BaseException:
            self.manager.close()
            raise

    def array(self, values) -> int:
        """Copy a numpy array into guest memory (64-byte aligned); returns
        its guest address. Freed when the plugin is closed."""
        data = np.ascontiguousarray(values)
        address = self.backend.alloc(max(data.nbytes, 1), 64)
        self.backend.write(address, data.tobytes())
        self._allocs.append(address)
        return address

    def read(self, address: int, dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` at guest ``address``."""
        dtype = np.dtype(dtype)
        return np.frombuffer(self.backend.read(address, dtype.itemsize * count),
                             dtype).copy()

    def params(self, layout, values: Mapping) -> bytes:
        """Bytes of a params struct: ``layout`` is a :class:`CStruct` (laid
        out for this architecture's pointer width) or a numpy structured
        dtype (used as given)."""
        if isinstance(layout, CStruct):
            return layout.layout(*self.backend.arch.c_abi).pack(**values)
        record = np.zeros((), np.dtype(layout))
        for key, value in values.items():
            record[key] = value
        return record.tobytes()

    def call(self, name: str, layout, values: Mapping) -> int:
        """Resolve import ``name`` and call it with a params struct built
        from ``values``; returns the import's int result (0: success).

        Raises:
            hal_cpu.UnresolvedImportError: the plugin does not provide it.
            elfloader.EmulationError: the import faulted (emulated).
        """
        from elfloader import as_int32
        fns, ctxs = self.manager.resolve([name])
        params = self.array(np.frombuffer(self.params(layout, values), np.uint8))
        return as_int32(self.backend.call(fns[0], params, ctxs[0], 0))

    def close(self) -> None:
        for address in self._allocs:
            self.backend.release(address)
        self._allocs = []
        self.manager.close()


@pytest.fixture
def hal_backend(request) -> str:
    """The backend kind chosen with ``--hal-backend``."""
    return request.config.getoption("--hal-backend")


@pytest.fixture
def hal_plugin(hal_arch, hal_backend):
    """``hal_plugin(spec)`` -> :class:`LoadedPlugin` for the current
    architecture; closed at the end of the test."""
    loaded: list[LoadedPlugin] = []

    def load(spec) -> LoadedPlugin:
        plugin = LoadedPlugin(str(spec), hal_arch, hal_backend)
        loaded.append(plugin)
        return plugin

    yield load
    for plugin in loaded:
        plugin.close()


@pytest.fixture
def hal_executable(hal_arch, hal_backend):
    """``hal_executable(path, plugins=None)`` -> :class:`hal_cpu.Executable`
    for the current architecture (a FatELF picks its record); closed at the
    end of the test."""
    from .library import Executable
    opened: list = []

    def load(path, plugins=None):
        exe = Executable(path, arch=hal_arch, backend=hal_backend,
                         plugins=getattr(plugins, "manager", plugins))
        opened.append(exe)
        return exe

    yield load
    for exe in opened:
        exe.close()
