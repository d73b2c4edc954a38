"""Target ``program``: hostile compiled programs run by :mod:`hal_cpu.programs.vm`.

Seeds are the ``vmfb`` target's compiled modules (:mod:`fuzz.vmfb`). A case
is a seed with zero to two of the ``vmfb`` target's FlatBuffer mutations
(:func:`fuzz.vmfb.mutate_vmfb`) and, in most cases, bytes changed inside
the module's VM bytecode (a program importing a host module is left as
compiled in 30% of its cases, so that its host module's behaviour is what
is tested) (so the decoder, the translator and the
translated code meet opcodes, register numbers, branch targets and call
ordinals nobody compiled); and a host module for the programs that import
one (``custom``), behaving per case (:data:`HOST_MODES`):

* ``ok``: the module as the samples define it;
* ``raise``: its functions raise;
* ``wrong``: they return values of the wrong kind (a string for a ref, a
  float for an integer, too many results);
* ``never``: ``string.create`` never returns.

The child (:func:`run`) does what a user does: ``load_program`` with a
time limit (``timeout``), then calls every public function with inputs
made from its declaration (zeros of each tensor type, scalars 1), natively
or emulated as the case's backend says. A ``never`` case cannot be
stopped from inside the process (Python code of a host module), so it
runs as ``hal-cpu run-module --timeout=1`` in a process of its own, which
must end within the limit plus its grace period with one line on stderr.
Every call must end with a result or a typed error, within the time
bound, inside the memory bound.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: How a case's host module behaves.
HOST_MODES = ("ok", "ok", "raise", "wrong", "never")
#: Seconds one call may take (``Program.timeout``); a ``never`` case's
#: command must end within ``TIME_LIMIT + GRACE``.
TIME_LIMIT = 2.0
GRACE = 3.0
#: Largest tensor input made from a declaration, in elements.
MAX_INPUT_ELEMENTS = 1 << 20

_TENSOR = re.compile(r"tensor<([0-9x?]*)x?(i1|i8|i16|i32|i64|f16|f32|f64|bf16)>")


def bytecode_mutation(rng, data: bytes):
    """``(description, ops)`` changing 1-8 bytes of the seed's VM bytecode,
    or None when the seed has none."""
    from hal_cpu.programs.vm.module_def import read_module
    mdef = read_module(data, name="seed")
    start, length = mdef._bytecode
    if length <= 0:
        return None
    k = rng.choice([1, 1, 2, 3, 8])
    ops, where = [], []
    for _ in range(k):
        at = start + rng.randrange(length)
        ops.append(("set", at, bytes([rng.randrange(256)])))
        where.append(f"{at - start:#x}")
    return f"bytecode: {k} bytes at {','.join(where)}", ops


def mutate_program(rng, seed) -> tuple[list, str]:
    """The mutations of a case and its host module's mode."""
    from .vmfb import mutate_vmfb
    muts = []
    hosted = "host_modules" in seed.path
    r = rng.random()
    if hosted and r < 0.3:
        pass                        # the module as compiled: its host module misbehaves
    elif r < 0.45:
        muts += mutate_vmfb(rng, seed.model, count=rng.choice([1, 2]))
    if r >= 0.3:
        m = bytecode_mutation(rng, seed.data)
        if m is not None:
            muts.append(m)
    mode = rng.choice(HOST_MODES) if hosted else "ok"
    return muts, mode


# ---------------------------------------------------------------------------
# the host module of the case

class _String:
    def __init__(self, value):
        self.value = value


def host_module(mode: str):
    """The ``custom`` module of IREE's custom-module samples, behaving as
    ``mode`` says."""
    from hal_cpu.programs import HostModule

    def create(data):
        if mode == "never":
            while True:
                time.sleep(0.01)
        if mode == "raise":
            raise RuntimeError("host module failure")
        if mode == "wrong":
            return "not a string object"
        return _String(bytes(data).decode("utf-8", "replace"))

    def length(s):
        if mode == "wrong":
            return 1.5
        return len(getattr(s, "value", ""))

    def show(s):
        if mode == "wrong":
            return (1, 2, 3)
        return None

    return HostModule("custom", {"string.create": create, "string.length": length,
                                 "string.print": show, "string.dprint": show,
                                 "string.from_tensor": lambda t: _String(repr(t)),
                                 "error": lambda: (_ for _ in ()).throw(RuntimeError("x"))},
                      types={"custom.string": _String})


def declared_inputs(fn, dynamic: int, max_elements: int = MAX_INPUT_ELEMENTS) -> list:
    """Each argument of ``fn`` as its declaration gives it: None for a
    scalar, else ``(shape, dtype)`` of the tensor (dynamic sizes
    ``dynamic``; a tensor of more than ``max_elements`` elements becomes
    all ones; a ref without a declared tensor type ``(4,)`` float32)."""
    import numpy as np

    from hal_cpu.buffers import DTYPES
    tensors = _TENSOR.findall(fn.declaration or "")
    specs: list = []
    for ty in fn.arg_types:
        if ty != "r":
            specs.append(None)
        elif tensors:
            dims, elem = tensors.pop(0)
            shape = tuple(dynamic if d in ("", "?") else int(d)
                          for d in dims.split("x") if d != "")
            count = 1
            for d in shape:
                count *= d
            if count > max_elements:
                shape = (1,) * len(shape)
            specs.append((shape, DTYPES.get(elem, np.float32)))
        else:
            specs.append(((4,), np.float32))
    return specs


def inputs_of(fn) -> list:
    """Inputs for ``fn`` from its declaration: zeros of each tensor type
    (dynamic sizes 1), scalar arguments 1."""
    import numpy as np
    return [1 if spec is None else np.zeros(*spec)
            for spec in declared_inputs(fn, 1)]


# ---------------------------------------------------------------------------
# the child

def run(case, data, rep, opts):
    """Load the mutated program and call every public function (see the
    module docstring); a ``never`` case runs as a command line."""
    if case.get("host_mode") == "never":
        return _run_command(case, data, rep, opts)
    from hal_cpu.programs.vm import load_program
    backend = "native" if case["backend"] == "native" else "emulated"
    rep.enter("parse")
    hosts = [host_module(case.get("host_mode", "ok"))]
    program = load_program(data, backend=backend, host_modules=hosts,
                           timeout=TIME_LIMIT)
    try:
        first = None
        for name, fn in program.functions.items():
            rep.enter("dispatch")
            try:
                fn(*inputs_of(fn))
            except Exception as exc:  # the first error is the case's outcome
                from fatelf import PortableKernelError
                if not isinstance(exc, PortableKernelError):
                    raise
                rep.mark_failure()
                first = first or exc
        if first is not None:
            raise first
    finally:
        rep.enter("close")
        program.close()


class CommandError(Exception):
    """A ``never`` case's command did not end as promised (not a typed
    error: the harness counts it as an escape)."""


def _run_command(case, data, rep, opts):
    rep.enter("dispatch")
    with tempfile.TemporaryDirectory(prefix="pkr-fuzz-program-") as tmp:
        path = os.path.join(tmp, "case.vmfb")
        with open(path, "wb") as f:
            f.write(data)
        module = os.path.join(tmp, "never.py")
        with open(module, "w") as f:
            f.write("from fuzz.programs import host_module\n"
                    "def create_module(version, params):\n"
                    "    return host_module('never')\n")
        backend = "native" if case["backend"] == "native" else "emulated"
        start = time.monotonic()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        proc = subprocess.run(
            [sys.executable, "-m", "hal_cpu", "run-module", path,
             f"--host_module={module}", f"--backend={backend}", "--timeout=1"],
            capture_output=True, text=True, timeout=1 + GRACE + 20, env=env)
        took = time.monotonic() - start
    if took > 1 + GRACE + 2:
        raise CommandError(f"run-module --timeout=1 took {took:.1f} s")
    if proc.returncode == 0:
        return
    lines = proc.stderr.strip().splitlines()
    if proc.returncode not in (1, 2) or len(lines) != 1:
        raise CommandError(f"run-module ended with status {proc.returncode} and "
                           f"{len(lines)} lines on stderr: {proc.stderr[-400:]}")
    from hal_cpu.errors import HalCpuError
    raise HalCpuError(lines[0], name="case.vmfb", field="run-module")


# ---------------------------------------------------------------------------
# target ``mlir``: mutated program text, compiled and run by the MLIR path

#: Seeds of the ``mlir`` target (small programs: each case compiles).
MLIR_PROGRAMS = ("tests/programs/host_code.mlir", "tests/programs/add_i32.mlir",
                 "tests/programs/int_ops.mlir", "tests/programs/check/elementwise.mlir",
                 "tests/programs/host_modules/basic.mlir", "tests/programs/limits.mlir")
#: Seconds one case's compile may take.
COMPILE_LIMIT = 10.0

_NUMBER = re.compile(rb"-?\b\d+\b")
_TYPES = (b"i1", b"i8", b"i32", b"i64", b"f16", b"f32", b"f64", b"index")


def mlir_seed_files() -> list[tuple[str, Path]]:
    root = Path(__file__).resolve().parent.parent
    return [(f"mlir:{p}", root / p) for p in MLIR_PROGRAMS]


def mutate_mlir(rng, data: bytes) -> list:
    """1 to 3 edits of the program text, as ``[(description, ops)]`` whose
    ops replace the whole text (the edits move bytes around)."""
    text = data
    what = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        lines = text.split(b"\n")
        kind = rng.choice(["number", "number", "type", "drop", "dup", "swap",
                           "bytes", "cut", "utf8"])
        if kind == "number":
            found = list(_NUMBER.finditer(text))
            if found:
                m = rng.choice(found)
                new = str(rng.choice([0, -1, 1, 2, 3, 255, 65536, 2**31 - 1, -2**31,
                                      2**32, 2**40, 2**63 - 1])).encode()
                text = text[:m.start()] + new + text[m.end():]
                what.append(f"number at {m.start()} -> {new.decode()}")
                continue
        if kind == "type":
            found = [t for t in _TYPES if t in text]
            if found:
                a, b = rng.choice(found), rng.choice(_TYPES)
                text = text.replace(a, b, 1)
                what.append(f"type {a.decode()} -> {b.decode()}")
                continue
        if kind in ("drop", "dup", "swap") and len(lines) > 2:
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if kind == "drop":
                del lines[i]
            elif kind == "dup":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = b"\n".join(lines)
            what.append(f"{kind} line {i + 1}" + (f" / {j + 1}" if kind != "drop" else ""))
            continue
        if kind == "cut":
            at = rng.randrange(len(text) + 1)
            text = text[:at]
            what.append(f"cut at {at}")
            continue
        at = rng.randrange(len(text) + 1)
        junk = (bytes([0xff, 0xfe]) if kind == "utf8" else
                bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 12))))
        text = text[:at] + junk + text[at:]
        what.append(f"{len(junk)} bytes at {at}")
    return [("; ".join(what), [("truncate", 0), ("append", text)])]


def run_mlir(case, data, rep, opts):
    """Compile the mutated text (bounded) and run every public function on
    the VM with a time and memory limit; a program importing the host
    module gets one behaving as the case says."""
    import numpy as np

    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import load_program
    from hal_cpu.programs.vm.vmfb import check_text
    backend = "native" if case["backend"] == "native" else "emulated"
    with tempfile.TemporaryDirectory(prefix="pkr-fuzz-mlir-") as tmp:
        path = os.path.join(tmp, "case.mlir")
        with open(path, "wb") as f:
            f.write(data)
        rep.enter("parse")
        check_text(path)
        comp = compile_program(path, case["arch"], os.path.join(tmp, "cache"),
                               timeout=COMPILE_LIMIT)
        first = None
        with load_program(comp, backend=backend, timeout=TIME_LIMIT,
                          memory_limit=1 << 30,
                          host_modules=[host_module(case.get("host_mode", "ok"))]
                          ) as program:
            for fn in program.functions.values():
                rep.enter("dispatch")
                inputs = [np.zeros(4, np.float32) if ty == "r" else 1
                          for ty in fn.arg_types]
                try:
                    fn(*inputs)
                except Exception as exc:
                    from fatelf import PortableKernelError
                    if not isinstance(exc, PortableKernelError):
                        raise
                    rep.mark_failure()
                    first = first or exc
        if first is not None:
            raise first
