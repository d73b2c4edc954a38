"""The ``hal`` imports a translated VM function runs in place (their
``vm_inline`` expressions, :mod:`hal_cpu.programs.vm.translate`): each
behaves as a call of the import does, for usual and hostile operands
alike (same result, or same error: type, status code, message), and a
program whose calls are translated so runs and fails as IREE's does, from
a fresh translation and from the cache of translations."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm.hal_module import BufferView, Fence, HalModule
from hal_cpu.programs.vm.refs import VmBuffer
from hal_cpu.programs.vm.translate import _Gen, _inline_of

HERE = Path(__file__).parent
MLP = HERE / "programs" / "vm_hal" / "mlp.mlir"
HOST = arches.host_arch()
F32 = 0x21000020
DENSE = 1


def _outcome(fn, args):
    """What ``fn(*args)`` does: ("ok", result) or ("raise", type, code,
    message)."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return ("raise", type(exc), getattr(exc, "code", None), str(exc))


class _Consts:
    """What the translator's ``inline_call`` binds constants through (its
    ``const``), into a namespace of our own."""

    def __init__(self):
        self.ns: dict = {}

    def const(self, value, prefix="_k", origin=None):
        name = f"{prefix}{len(self.ns)}"
        self.ns[name] = value
        return name


def _inline_function(method_name: str, hal: HalModule, args: tuple):
    """The expression the translator writes for a call of
    ``hal.<method_name>`` with operands like ``args`` (a tuple of 1-tuples
    as a variadic operand), made a function of those operands; None when
    no inline expression fits the call."""
    imp = getattr(hal, method_name)
    inline = _inline_of(imp)
    assert inline, method_name
    operands, params = [], []
    for i, a in enumerate(args):
        if type(a) is tuple and a and all(type(t) is tuple for t in a):
            names = [[f"v{i}_{j}_{k}" for k in range(len(t))] for j, t in enumerate(a)]
            params += [n for t in names for n in t]
            operands.append("(" + "".join("(" + "".join(n + ", " for n in t) + "), "
                                          for t in names) + ")")
        else:
            params.append(f"a{i}")
            operands.append(f"a{i}")
    consts = _Consts()
    text = _Gen.inline_call(consts, inline, "_imp", operands, 0)
    if text is None:
        return None
    ns = dict(consts.ns, _imp=imp)
    exec(compile(f"def f({', '.join(params)}):\n    return {text}\n", "<inline>",
                 "exec"), ns)
    flat = [x for a in args for x in
            ((y for t in a for y in t) if type(a) is tuple and a
             and all(type(t) is tuple for t in a) else (a,))]
    return lambda *_: ns["f"](*flat)


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "raise":
        return a == b
    x, y = a[1], b[1]
    if type(x) is not type(y):
        return False
    if type(x) is BufferView:
        return (x.buffer is y.buffer or (x.buffer.address == y.buffer.address
                                         and x.buffer.length == y.buffer.length)) \
            and (x.dims, x.element_type, x.encoding_type) == \
            (y.dims, y.element_type, y.encoding_type)
    if type(x) is Fence:
        return (x.parts, x.code, x.waiters) == (y.parts, y.code, y.waiters)
    return x is y or x == y


def test_every_inline_behaves_as_its_import():
    with HalModule(arch="x86_64") as hal:
        dev = hal.device
        view = hal.wrap_input(np.ones((4, 16), np.float32))
        buf = view.buffer
        msg = VmBuffer(b"input0", True, "message")
        dims = ((4,), (16,))
        hostile = [None, 0, msg, buf, view, Fence(), dev.allocator, object()]
        cases = {
            "fence_create": [(dev, 0), (dev, -1)] + [(h, 0) for h in hostile],
            "device_allocator": [(dev,)] + [(h,) for h in hostile],
            "buffer_view_buffer": [(view,)] + [(h,) for h in hostile],
            "buffer_view_assert": (
                [(view, msg, F32, DENSE, dims), (view, msg, F32, 0, dims),
                 (view, msg, F32, DENSE, ((4,), (15,))),
                 (view, msg, F32, DENSE, ((64,),)),
                 (view, msg, F32 | -0x100000000, DENSE, dims),
                 (view, msg, 0x11000020, DENSE, dims),
                 (view, msg, F32, 7, dims), (view, None, F32, DENSE, ((1,),))]
                + [(h, msg, F32, DENSE, dims) for h in hostile]),
            "buffer_assert": (
                [(buf, msg, dev.allocator, 256, 16, 3075),
                 (buf, msg, dev.allocator, 257, 16, 3075),
                 (buf, msg, dev.allocator, -1, 16 | -0x100000000, 3075),
                 (buf, msg, dev.allocator, 0, 0x7FFFFFFF, 3075),
                 (buf, msg, dev.allocator, 0, 16, 0x7FFFFFFF),
                 (buf, msg, dev.allocator, 0, 16, 3075 | -0x100000000),
                 (buf, msg, dev, 256, 16, 3075), (buf, None, dev.allocator, 256, 16, 3075)]
                + [(h, msg, dev.allocator, 0, 16, 3075) for h in hostile]
                + [(buf, h, dev.allocator, 0, 16, 3075) for h in hostile]
                + [(buf, msg, h, 0, 16, 3075) for h in hostile]),
            "buffer_view_create": (
                [(buf, 0, 256, F32, DENSE, dims), (buf, 0, -1, F32, DENSE, dims),
                 (buf, 64, 128, F32, DENSE, ((2,), (16,))),
                 (buf, 0, 257, F32, DENSE, dims), (buf, -4, 256, F32, DENSE, dims),
                 (buf, 0, 256, -1, -1, dims), (buf, 0, 256, F32, DENSE, ()),
                 (buf, 200, 100, F32, DENSE, dims)]
                + [(h, 0, 256, F32, DENSE, dims) for h in hostile]),
        }
        reached, pending = Fence(None, 0), Fence()
        failed = Fence(None, 13)
        failed.message = "failed by the program"
        joined = Fence((Fence(), Fence()))
        fences = [reached, pending, failed, joined, None, view, 0, object()]
        sets = ([((f,),) for f in fences]
                + [((f,), (g,)) for f in fences for g in fences]
                + [((reached,),) * 3, ((reached,),) * 4, ((reached,),) * 4 + ((pending,),),
                   ((reached,), (reached,), (failed,)), ()])
        cases["fence_await"] = [(t, 0, fs) for fs in sets for t in (-1, 0)]
        cases["fence_join"] = [(0, fs) for fs in sets]
        for name, calls in cases.items():
            imp = getattr(hal, name)
            assert imp.vm_inline, name
            inlined = 0
            for args in calls:
                inline = _inline_function(name, hal, args)
                if inline is None:
                    continue
                inlined += 1
                want, got = _outcome(imp, args), _outcome(inline, args)
                assert _same(want, got), (name, args, want, got)
            assert inlined, name
            # (the errors are there: at least one hostile call fails)
            assert any(_outcome(imp, a)[0] == "raise" for a in calls), name


@pytest.fixture(scope="module")
def mlp_vmfb(compile_cache):
    return compile_program(MLP, HOST, compile_cache).vmfb


def _reference(x: np.ndarray) -> np.ndarray:
    from test_vm_hal_module import reference
    return reference(x)


def test_translated_calls_inline_and_run(mlp_vmfb, tmp_path):
    """A fresh translation (no cache) and then one read back from the cache
    (in another process) write the inline expressions, give IREE's results
    and fail a wrong input with the import's own message."""
    script = (
        "import sys, numpy as np\n"
        "from hal_cpu.programs.vm import load_program\n"
        "p = load_program(sys.argv[1], workers=1)\n"
        "fn = p.function('predict')\n"
        "x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)\n"
        "np.save(sys.argv[2], fn(x)[0])\n"
        "print(fn._fn.vm_source)\n"
        "try:\n"
        "    fn(np.zeros((4, 15), np.float32))\n"
        "except Exception as e:\n"
        "    print('ERROR', type(e).__name__, e.code, e.message)\n")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    outs = []
    for i in range(2):
        out = subprocess.run([sys.executable, "-c", script, str(mlp_vmfb),
                              str(tmp_path / f"r{i}.npy")], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout)
        # (the first run wrote the translations the second one reads)
        assert list((tmp_path / "cache").rglob("*.marshal"))
        x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
        np.testing.assert_allclose(np.load(tmp_path / f"r{i}.npy"), _reference(x),
                                   rtol=2e-6, atol=1e-7)
    assert outs[0] == outs[1]
    src = outs[0]
    # fence.create written out: a Fence made in place, the import called
    # only for another operand
    assert re.search(r"= \(_inl\d+\(\) if type\(r\d+\) is _inl\d+ else _imp\d+\(", src)
    assert re.search(r"ERROR \w+ 3 ", src)       # INVALID_ARGUMENT
    assert "shape dimension 1 mismatch; expected 16 but have 15" in src
