"""The runtime support library: a workgroup loop in machine code.

``workgroup_loop.c`` (freestanding C, no libc) exports

    int hal_cpu_workgroup_loop(dispatch_fn, environment, dispatch_state,
                               workgroup_state, range)

which runs the workgroups with linear ids ``range.begin <= i < range.end``
of the dispatch grid (``i = x + count_x * (y + count_y * z)``, x fastest),
storing each id in the workgroup state and calling the dispatch function,
until one returns non-zero or the stop flag becomes non-zero. A host then
crosses into the backend once per chunk of workgroups instead of once per
workgroup. The dispatch function, environment and both states are those of
IREE's executable library ABI v0.6 (:mod:`hal_cpu.abi`).

It is built for every architecture the runtime runs and packed into the
FatELF bundle :data:`BUNDLE` (``python -m hal_cpu.buildtools.runtime``); load it
into the same backend as the executable::

    loop = elfloader.load(BUNDLE, backend=executable_backend)
    status = backend.call(loop.lookup(LOOP_SYMBOL), fn, env, state, wg, range)

Return values: :data:`LOOP_OK`, the non-zero return of a failing workgroup
(then ``range.status`` holds it and ``range.failed_index`` its id),
:data:`LOOP_STOPPED` or :data:`LOOP_INVALID`. A workgroup failed exactly
when ``range.status != 0``. The C file's header comment is the reference.

The package also holds the support library of executables for 32-bit
targets: the math functions that ``iree-compile`` 3.13 leaves missing or
empty there (``libm.c``) joined with compiler-rt's builtins as zig ships
them (float conversions such as ``__extendsfdf2`` and ``__truncdfhf2``,
64-bit division and shifts, ARM's ``__aeabi_*`` helpers), one relocatable
object per architecture of :data:`LIBM_ARCHES` packed into
:data:`LIBM_BUNDLE`, and the linker that links them in
(:data:`LIBM_LINKER`, run by :func:`hal_cpu.programs.compile_program`).
A library built without them that calls an empty function is refused when
it loads (:mod:`hal_cpu.empty_functions`).
"""

from __future__ import annotations

from pathlib import Path

from elfloader.arch import ARCHES
from fatelf.cstruct import CStruct

HERE = Path(__file__).resolve().parent

#: The FatELF bundle of the library, one record per runtime architecture.
BUNDLE = HERE / "runtime.sos"

#: Its C source.
SOURCE = HERE / "workgroup_loop.c"

#: Math functions for 32-bit executables (see ``libm.c``).
LIBM_SOURCE = HERE / "libm.c"

#: Their relocatable objects, one FatELF record per architecture of
#: :data:`LIBM_ARCHES`.
LIBM_BUNDLE = HERE / "libm.sos"

#: The linker ``iree-compile`` runs for :data:`LIBM_ARCHES`: ``iree-lld``
#: with the empty functions' calls sent to the objects' (standard library
#: only: it runs as a script).
LIBM_LINKER = HERE.parent / "buildtools" / "libm_link.py"

#: Architectures whose executables link the objects, and the zig flags
#: that build them: the architecture's least capable CPU (x87 only; VFPv3
#: without NEON; RV32IM with iree-compile's ilp32 calls), so that one object
#: serves every profile. Derived from
#: each :attr:`elfloader.arch.Arch.builds`'s ``libm`` (empty: no row), in
#: the order of the runtime's architectures.
LIBM_ARCHES: dict[str, tuple[str, ...]] = {a.name: a.builds.libm for a in ARCHES
                                           if a.builds.libm}

_F16_XMM0 = {"__truncsfhf2": "hal_cpu_truncsfhf2_xmm0",
             "__truncdfhf2": "hal_cpu_truncdfhf2_xmm0"}

#: musl's rounding functions as iree-compile 3.13 links them for 32-bit
#: targets (bitcode built for wasm32, FLT_EVAL_METHOD 0) round by adding and
#: subtracting 2^23 (2^52): on x87 without SSE, where the sum keeps a 64-bit
#: mantissa, ``roundf(0.7)`` is 0.7. libm.c's work on the bits, exactly.
_X87_ROUNDING = {name: name for name in (
    "roundf", "rintf", "nearbyintf", "roundevenf", "floorf", "ceilf", "truncf",
    "rint", "nearbyint", "roundeven", "ceil", "trunc")}

#: Calls :data:`LIBM_LINKER` sends to a function of ``libm.c`` with another
#: calling convention, per (architecture, CPU profile): with SSE2, LLVM
#: expects x86_32's f32/f64 -> f16 conversions to return the half in xmm0,
#: while IREE's device library returns it in st(0) and eax. And x87-only
#: code's rounding functions (``NAME: NAME``: the local definition replaced
#: by libm.c's exact one).
LIBM_REDIRECTS: dict[tuple[str, str], dict[str, str]] = {
    ("x86_32", "pentium4"): _F16_XMM0,
    ("x86_32", "haswell"): _F16_XMM0,
    ("x86_32", "i686"): _X87_ROUNDING,
}

#: The exported loop function.
LOOP_SYMBOL = "hal_cpu_workgroup_loop"

#: The exported batch function: several dispatches' workgroup loops in
#: order in one crossing (``hal_cpu_dispatch_batch``; see the C file).
BATCH_SYMBOL = "hal_cpu_dispatch_batch"

#: Every symbol the library exports.
SYMBOLS = (LOOP_SYMBOL, BATCH_SYMBOL)

#: Every workgroup of the range ran and returned 0 (an empty range too);
#: ``range.begin == range.end`` afterwards.
LOOP_OK = 0

#: The stop flag was non-zero before a workgroup ran; ``range.begin`` is the
#: first id not run, ``range.status`` is 0. (INT32_MIN.)
LOOP_STOPPED = -(1 << 31)

#: A NULL argument, a zero workgroup count, a range reaching past the grid,
#: or a stop address wider than the target's pointers: nothing ran and the
#: range was not written. (INT32_MIN + 1.)
LOOP_INVALID = -(1 << 31) + 1

#: ``range.failed_index`` when no workgroup failed.
NO_INDEX = (1 << 64) - 1

#: Largest ``range.end``: linear ids are 64-bit.
MAX_END = (1 << 64) - 1

#: ``hal_cpu_workgroup_range_t``: fixed-width fields only, so every target
#: has the same offsets and size (40 bytes); alignment 8 (4 on x86_32).
#: ``stop`` is the address of a ``uint32_t`` flag (0: none) held in 64 bits
#: on every target; ``reserved`` is not read.
WORKGROUP_RANGE = CStruct("hal_cpu_workgroup_range_t", [
    ("begin", "u64"),         # in: first linear id; out: first id not done
    ("end", "u64"),           # in: one past the last linear id
    ("failed_index", "u64"),  # out: id of the failing workgroup, else NO_INDEX
    ("stop", "u64"),          # in: address of a uint32_t stop flag, or 0
    ("status", "i32"),        # out: the failing workgroup's return, else 0
    ("reserved", "u32"),
], "hal_cpu/runtime/workgroup_loop.c")

__all__ = ["BUNDLE", "SOURCE", "LOOP_SYMBOL", "BATCH_SYMBOL", "SYMBOLS", "LOOP_OK", "LOOP_STOPPED",
           "LOOP_INVALID", "NO_INDEX", "MAX_END", "WORKGROUP_RANGE",
           "return_name"]


def return_name(value: int) -> str:
    """Name of a loop return value (``OK``, ``STOPPED``, ``INVALID`` or
    ``WORKGROUP_FAILED(<n>)``); ``value`` as a signed 32-bit int."""
    return {LOOP_OK: "OK", LOOP_STOPPED: "STOPPED",
            LOOP_INVALID: "INVALID"}.get(value, f"WORKGROUP_FAILED({value})")
