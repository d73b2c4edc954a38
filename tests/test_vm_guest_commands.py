"""Recorded dispatches of the ``hal`` module on emulated backends: each
binding on a guarded guest range kept for the command's life (copied in and
back per run, pointers rewritten only), with the results, overrun reports
and fallbacks of :meth:`hal_cpu.Executable.dispatch`."""
from __future__ import annotations

import numpy as np
import pytest
from test_vm_hal_module import (  # noqa: E402
    ANY,
    DENSE,
    F32,
    MlpProgram,
    inputs,
    mlp,  # noqa: F401 (the fixture)
    reference,
)

from hal_cpu import BindingOverrunError
from hal_cpu.programs.vm.hal_module import HalModule

ARCH = "aarch64"


@pytest.fixture(params=["unicorn", "qemu"])
def engine(request):
    from elfloader.backend.emulated import qemu_program
    from fatelf import arches
    if request.param == "qemu" and qemu_program(arches.lookup(ARCH)) is None:
        pytest.skip("qemu-user is not installed")
    return request.param


def _guest_runs(hal) -> int:
    """Guarded binding ranges the module's executables hold."""
    return sum(len(exe.guarded) for _, exe in hal._executables.values())


def test_repeated_calls_match_the_library_path(mlp, engine):  # noqa: F811
    _, mdef = mlp(ARCH)
    xs = [inputs(seed) for seed in range(4)]
    with HalModule(arch=ARCH, backend="emulated", engine=engine,
                   workers=1) as hal:
        prog = MlpProgram(hal, mdef)
        fast = [hal.to_numpy(prog.predict(hal.wrap_input(x))) for x in xs]
        # both dispatches hold their ranges once the second one (4
        # workgroups) knows its pace
        assert _guest_runs(hal) == 4
        hal.timeout = 30       # through hal_cpu.Executable.dispatch
        slow = [hal.to_numpy(prog.predict(hal.wrap_input(x))) for x in xs]
        hal.timeout = None
        again = hal.to_numpy(prog.predict(hal.wrap_input(xs[0])))
        backend = next(iter(hal._executables.values()))[1].library.backend
        held = backend.mapped_bytes
    for x, f, s in zip(xs, fast, slow):
        np.testing.assert_array_equal(f, s)
        np.testing.assert_allclose(f, reference(x), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(again, fast[0])
    assert held > 0 and _guest_runs(hal) == 0       # freed on close
    with HalModule(arch=ARCH, backend="emulated", engine=engine) as hal:
        # the default workers: the same results, whichever path each takes
        prog = MlpProgram(hal, mdef)
        for x, f in zip(xs * 2, fast * 2):
            np.testing.assert_array_equal(
                hal.to_numpy(prog.predict(hal.wrap_input(x))), f)


def _program(hal, mdef, result_length: int, same_buffer: bool = False):
    """The MLP with its second dispatch writing a ``result_length``-byte
    binding (the kernel writes 128 bytes); with ``same_buffer`` its input
    and output are one range of one buffer (in place)."""
    prog = MlpProgram(hal, mdef)
    c = prog.call
    cb = c("command_buffer.create", prog.device, 0, 3, ANY, 3)
    f0 = c("executable.lookup.function", prog.exe, prog.names[0])
    f1 = c("executable.lookup.function", prog.exe, prog.names[1])
    c("command_buffer.dispatch", cb, prog.exe, f0, 1, 1, 1, 0, (),
      ((0, 0, None, 0, 256), (0, 2, None, 0, 128)))
    c("command_buffer.execution_barrier", cb, 28, 13, 0)
    out_slot = 2 if same_buffer else 1
    c("command_buffer.dispatch", cb, prog.exe, f1, 4, 1, 1, 0, (),
      ((0, 2, None, 0, 128), (0, out_slot, None, 0, result_length)))
    c("command_buffer.finalize", cb)
    prog.cb = cb
    return prog


def _run(hal, prog, x):
    c = prog.call
    buf = c("buffer_view.buffer", hal.wrap_input(x))
    result = hal._allocate(128, 0, 0, False)
    transient = hal._allocate(128, 0, 0, False)
    c("device.queue.execute.indirect", prog.device, ANY, None, None, prog.cb, 0,
      ((buf, 0, 256), (result, 0, 128), (transient, 0, 128)))
    return (hal.to_numpy(c("buffer_view.create", result, 0, 128, F32, DENSE,
                           ((4,), (8,)))),
            hal.to_numpy(c("buffer_view.create", transient, 0, 128, F32, DENSE,
                           ((4,), (8,)))))


def test_overlapping_bindings_run_as_the_library_maps_them(mlp, engine):  # noqa: F811
    """Bindings on one range (in place) are not given ranges of their own:
    the kernel sees them overlap, as hal_cpu.Executable.dispatch maps
    them."""
    _, mdef = mlp(ARCH)
    x = inputs(5)
    with HalModule(arch=ARCH, backend="emulated", engine=engine) as hal:
        prog = _program(hal, mdef, 128, same_buffer=True)
        runs = [_run(hal, prog, x)[1] for _ in range(3)]
        hal.timeout = 30
        slow = _run(hal, prog, x)[1]
    for r in runs:
        np.testing.assert_array_equal(r, slow)


@pytest.mark.parametrize("length", [100, 64])
def test_overrun_reported(mlp, engine, length):  # noqa: F811
    """A kernel writing past the end of a binding: into its canary (100
    bytes: seen after the run) or its guard page (64 bytes: the write
    faults); reported on the first run and on later ones (the ranges and
    canaries are kept)."""
    _, mdef = mlp(ARCH)
    x = inputs(6)
    with HalModule(arch=ARCH, backend="emulated", engine=engine,
                   workers=1) as hal:
        prog = _program(hal, mdef, length)
        for _ in range(3):
            with pytest.raises(BindingOverrunError) as info:
                _run(hal, prog, x)
            err = info.value
            assert err.binding == 1 and err.length == length
            assert err.offset >= length
            assert err.fault.kind == ("overrun" if length % 64 else "write_unmapped")
        # (the first run measured the pace; the later ones ran on the
        # command's guest ranges)
        assert _guest_runs(hal) == 4
        # a correct command of the same export still runs (and is right)
        good = MlpProgram(hal, mdef)
        out = hal.to_numpy(good.predict(hal.wrap_input(x)))
    np.testing.assert_allclose(out, reference(x), rtol=2e-6, atol=1e-7)
