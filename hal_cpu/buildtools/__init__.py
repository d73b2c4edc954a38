"""Build tools: what makes the binaries this project ships and tests.

* :mod:`~hal_cpu.buildtools.zig`: zig's clang (PyPI ``ziglang``) building
  executable plugins and freestanding objects for every architecture;
* :mod:`~hal_cpu.buildtools.runtime`: the runtime support library's and
  libm's FatELF bundles (``python -m hal_cpu.buildtools.runtime``);
* :mod:`~hal_cpu.buildtools.libm_link`: the linker wrapper
  :func:`hal_cpu.programs.compile_program` links executables through
  (``iree-lld`` plus hal_cpu's libm);
* :mod:`~hal_cpu.buildtools.samples`: the sample kernels in
  ``hal_cpu/samples`` (``python -m hal_cpu.buildtools.samples``).

Nothing in the ABI runtime or the program path imports this package; the
test harness and the CLI's ``build-plugin`` do.
"""
