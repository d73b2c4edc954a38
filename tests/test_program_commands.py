"""The program commands' rough edges, smoothed: long options in either
spelling, ``plan --vlen``, ``plan``'s ``run:`` lines running as printed
(plugins, constants, typed result bindings), ``--compare`` of a program
IREE's runtime cannot run, the compile cache keyed by content under
``--cache_dir``, and the interpreter's 64-byte-aligned buffers."""

from __future__ import annotations

import argparse
import shlex
import warnings

import numpy as np
import pytest

from elfloader.backend.emulated import qemu_program
from fatelf import arches
from hal_cpu.cli import build_parser, main

from conftest import ROOT

HOST = arches.host_arch()

#: 300 floats: more than iree-compile folds into a kernel, so the program
#: binds it as a constant buffer of the module.
CONST_VALUES = [1.0 + 0.5 * i for i in range(300)]
ADD_CONST = f"""func.func @addc(%a: tensor<300xf32>) -> tensor<300xf32> {{
  %c = arith.constant dense<[{", ".join(f"{v:.1f}" for v in CONST_VALUES)}]> : tensor<300xf32>
  %r = arith.addf %a, %c : tensor<300xf32>
  return %r : tensor<300xf32>
}}
"""


def cli(capsys, *args):
    """(exit status, stdout, stderr) of ``hal-cpu ARGS`` in this process."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_lines(out: str) -> list[list[str]]:
    """The ``run:`` lines of a plan, as argv lists."""
    return [shlex.split(ln.split("run:", 1)[1]) for ln in out.splitlines()
            if ln.startswith("  run:")]


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions
               if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices


# ---------------------------------------------------------------------------
# one flag style, both spellings accepted

@pytest.mark.parametrize("argv, dest, value", [
    (["run-module", "p.mlir", "--cache-dir=D"], "cache_dir", "D"),
    (["run-module", "p.mlir", "--cache_dir=D"], "cache_dir", "D"),
    (["run-module", "p.mlir", "--compile-flag=--x=1"], "compile_flag", ["--x=1"]),
    (["run-module", "p.mlir", "--compile_flag=--x=1"], "compile_flag", ["--x=1"]),
    (["run-module", "p.mlir", "--no-progress"], "no_progress", True),
    (["run-module", "p.mlir", "--output-max-element-count=3"],
     "output_max_element_count", 3),
    (["run-module", "p.mlir", "--executable-plugin=a.sos"], "executable_plugin",
     ["a.sos"]),
    (["plan", "p.mlir", "--save-dir=S"], "save_dir", "S"),
    (["plan", "p.mlir", "--save_dir", "S"], "save_dir", "S"),
    (["check-module", "p.mlir", "--cache-dir=D"], "cache_dir", "D"),
    (["run", "k.so", "--function=f", "--no-isolate"], "isolate", False),
    (["run", "k.so", "--function=f", "--no_isolate"], "isolate", False),
    (["run", "k.so", "--function=f", "--isolate"], "isolate", True),
    (["run", "k.so", "--function=f"], "isolate", None),
    (["run", "k.so", "--function=f", "--no-diagnose"], "diagnose", False),
    (["run", "k.so", "--entry-point=1"], "entry_point", 1),
    (["run", "k.so", "--function=f", "--print-bindings=none"], "print_bindings",
     "none"),
    (["run", "k.so", "--function=f", "--workgroup-count=2,1,1"], "workgroup_count",
     (2, 1, 1)),
])
def test_long_options_take_either_spelling(argv, dest, value):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value


def test_values_and_positionals_are_not_respelled():
    args = build_parser().parse_args(
        ["run-module", "my-prog_1.mlir", "--compile_flag=--iree-hal_x=a-b",
         "--input=2xf32=1,2"])
    assert args.program == "my-prog_1.mlir"
    assert args.compile_flag == ["--iree-hal_x=a-b"]


def test_help_shows_one_spelling_per_option():
    """Every long option is registered once, in IREE's underscore style."""
    parser, commands = _subparsers()
    for name, sub in commands.items():
        for action in sub._actions:
            longs = [s for s in action.option_strings if s.startswith("--")]
            assert len(longs) <= 1, (name, longs)
            for option in longs:
                assert "-" not in option[2:], (name, option)
        text = sub.format_help()
        for option in ("--cache-dir", "--save-dir", "--compile-flag", "--no-progress"):
            assert option not in text, (name, option)
    assert "_ or - between words (--cache_dir, --cache-dir)" in " ".join(
        parser.format_help().split())


def test_unknown_option_is_still_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "p.mlir", "--save-dirs=x"])
    assert info.value.code == 2
    assert "--save-dirs" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# plan --vlen, and run lines that run as printed

@pytest.fixture(scope="module")
def add_const(tmp_path_factory):
    path = tmp_path_factory.mktemp("addc") / "addc.mlir"
    path.write_text(ADD_CONST)
    return path


@pytest.mark.requires("qemu-user")  # an RVV profile runs on qemu only
def test_plan_takes_vlen_and_checks_it(add_const, compile_cache, capsys):
    rc, out, err = cli(capsys, "plan", add_const, f"--cache_dir={compile_cache}",
                       "--arch=riscv64", "--cpu=rv64gcv", "--vlen=512",
                       "--input=300xf32=1")
    assert rc == 0, err
    (line,) = run_lines(out)
    assert "--cpu=rv64gcv" in line and "--vlen=512" in line
    rc, out, err = cli(capsys, "plan", add_const, f"--cache_dir={compile_cache}",
                       "--arch=riscv64", "--cpu=rv64gcv", "--vlen=100",
                       "--input=300xf32=1")
    assert rc == 1 and out == ""
    assert err == ("hal-cpu: error: vlen: vector length 100 bits is not one of "
                   "128, 256, 512, 1024\n")
    rc, out, err = cli(capsys, "plan", add_const, f"--cache_dir={compile_cache}",
                       "--arch=riscv64", "--cpu=rv64gc", "--vlen=256",
                       "--input=300xf32=1")
    assert rc == 1 and "no scalable vectors" in err


@pytest.mark.skipif(not qemu_program("riscv64"), reason="qemu-riscv64 runs RVV")
def test_plan_trace_runs_at_the_vector_length(add_const, compile_cache, capsys):
    rc, out, err = cli(capsys, "plan", add_const, f"--cache_dir={compile_cache}",
                       "--arch=riscv64", "--cpu=rv64gcv", "--vlen=128", "--trace",
                       "--engine=qemu", "--input=300xf32=1")
    assert rc == 0, err
    (line,) = run_lines(out)
    assert {"--cpu=rv64gcv", "--vlen=128", "--engine=qemu"} <= set(line)


def test_plan_run_line_binds_constants_by_value(add_const, compile_cache, capsys,
                                                tmp_path):
    """The module's constant buffer is passed with its bytes (a file beside
    the compiled program, or in --save_dir), so the printed command
    computes what the program computes."""
    x = np.linspace(-1, 1, 300, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    want = x + np.array(CONST_VALUES, np.float32)
    for extra in ([], [f"--save_dir={tmp_path / 'saved'}"]):
        rc, out, err = cli(capsys, "plan", add_const, f"--cache_dir={compile_cache}",
                           f"--arch={HOST}", f"--input=@{tmp_path / 'x.npy'}", *extra)
        assert rc == 0, err
        assert "constant " in out and "(carried by the module)" in out
        (line,) = run_lines(out)
        const = [a for a in line if a.startswith("--binding=") and "xi8=@" in a]
        assert len(const) == 1, line
        if extra:
            assert str(tmp_path / "saved" / "constants") in const[0]
        rc, got, err = cli(capsys, *line[1:], f"--output=2=@{tmp_path / 'c.npy'}",
                           "--print_bindings=none")
        assert rc == 0, err
        np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), want)


def test_plan_run_line_types_result_bindings(programs_mm_rowsum, capsys, tmp_path):
    """A binding holding only f32 results is bound as f32 (not bytes)."""
    path, cache = programs_mm_rowsum
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 53)).astype(np.float32)
    b = rng.standard_normal((53, 29)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc, out, err = cli(capsys, "plan", path, f"--cache_dir={cache}", f"--arch={HOST}",
                       f"--input=@{tmp_path / 'a.npy'}", f"--input=@{tmp_path / 'b.npy'}")
    assert rc == 0, err
    first = run_lines(out)[0]
    typed = [a for a in first if a.startswith("--binding=") and a.endswith("xf32")]
    assert typed and not [a for a in first if a.endswith("xi8")], first
    rc, _, err = cli(capsys, *first[1:], "--print_bindings=none",
                     f"--output=2=@{tmp_path / 'm.npy'}")
    assert rc == 0, err
    m = np.load(tmp_path / "m.npy")
    assert m.dtype == np.float32
    np.testing.assert_allclose(m[:37 * 29].reshape(37, 29), a @ b, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def programs_mm_rowsum(compile_cache):
    return ROOT / "tests" / "programs" / "mm_rowsum.mlir", compile_cache


def test_plan_run_line_loads_the_plugins(compile_cache, capsys, tmp_path):
    """The plan of a program whose executables import plugin functions
    names the plugins on each run line: the first dispatch (the plugin's
    mul) runs as printed."""
    program = ROOT / "sample_plugins" / "standalone_example.mlir"
    plugin = ROOT / "sample_plugins" / "prebuilt" / "standalone.sos"
    rc, out, err = cli(capsys, "plan", program, f"--cache_dir={compile_cache}",
                       "--arch=aarch64", "--function=mixed_invocation",
                       "--input=100xf32=3", "--input=100xf32=2",
                       f"--executable_plugin={plugin}")
    assert rc == 0, err
    lines = run_lines(out)
    assert all(f"--executable_plugin={plugin}" in ln for ln in lines)
    rc, got, err = cli(capsys, *lines[0][1:], f"--output=2=@{tmp_path / 'p.npy'}",
                       "--print_bindings=none")
    assert rc == 0, err
    product = np.load(tmp_path / "p.npy").view(np.float32)[:100]
    np.testing.assert_array_equal(product, np.full(100, 6, np.float32))


# ---------------------------------------------------------------------------
# --compare of what IREE's runtime cannot run

def test_compare_with_a_host_module_says_iree_cannot(compile_cache, capsys):
    folder = ROOT / "tests" / "programs" / "host_modules"
    rc, out, err = cli(capsys, "run-module", folder / "basic.mlir",
                       f"--cache_dir={compile_cache}", "--compare",
                       f"--module={folder / 'custom_string.py'}")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:4] == ["EXEC @main", "CREATE hello", "PRINT hello",
                         "LENGTH hello = 5"]
    assert lines[-1] == (
        "compare: IREE's runtime cannot run @main here: no type registered with "
        "name '!custom.string' (host modules given with --module run in hal-cpu "
        "only); nothing compared")


def test_compare_still_compares_what_iree_runs(add_const, compile_cache, capsys):
    rc, out, err = cli(capsys, "run-module", add_const, f"--cache_dir={compile_cache}",
                       "--arch=riscv64", "--compare", "--input=300xf32=1")
    assert rc == 0, err
    assert out.splitlines()[-1] == (
        f"compare: result[0]: max abs error 0 (IREE runtime, {HOST})")


# ---------------------------------------------------------------------------
# the compile cache keys on content under --cache_dir

def test_same_name_different_content_do_not_collide(tmp_path, capsys):
    cache = tmp_path / "cache"
    results = []
    for k, scale in enumerate((2.0, 3.0)):
        folder = tmp_path / f"d{k}"
        folder.mkdir()
        (folder / "big2.mlir").write_text(
            "func.func @f(%a: tensor<8xf32>) -> tensor<8xf32> {\n"
            f"  %c = arith.constant dense<{scale}> : tensor<8xf32>\n"
            "  %r = arith.mulf %a, %c : tensor<8xf32>\n"
            "  return %r : tensor<8xf32>\n}\n")
        results.append(folder / "big2.mlir")
    for _ in range(2):          # each run reuses its own compile
        for path, want in zip(results, ("2", "3")):
            rc, out, err = cli(capsys, "run-module", path, f"--cache_dir={cache}",
                               "--input=8xf32=1")
            assert rc == 0, err
            assert out.splitlines()[-1] == "8xf32=" + " ".join([want] * 8)
    dirs = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert len([d for d in dirs if d.startswith(f"big2-{HOST}-")]) == 2, dirs


# ---------------------------------------------------------------------------
# a program's buffers are 64-byte aligned

def test_program_bindings_are_aligned_and_not_copied(compile_cache, tmp_path):
    """Every binding a program's dispatch gets (inputs, allocations,
    constants) starts on a 64-byte boundary, so a native dispatch uses it in
    place: no AlignmentCopyWarning, even for a binding over 1 MiB."""
    from hal_cpu import AlignmentCopyWarning
    from hal_cpu.programs import compile_program
    from hal_cpu.programs.vm import PlanRunner, load_program, plan_program, run_plan
    src = tmp_path / "big.mlir"
    n = 300_000
    src.write_text(ADD_CONST.replace("300", str(n)).replace(
        "dense<[" + ", ".join(f"{v:.1f}" for v in CONST_VALUES) + "]>", "dense<1.5>"))
    compiled = compile_program(src, HOST, compile_cache)
    x = np.arange(n, dtype=np.float32)
    seen = []

    def check(step, bindings):
        for b in bindings:
            if b.size:
                seen.append(b.__array_interface__["data"][0] % 64)

    plan = plan_program(compiled, [x], "addc")
    run_plan(plan, [x], check)
    assert seen and set(seen) == {0}
    with warnings.catch_warnings():
        warnings.simplefilter("error", AlignmentCopyWarning)
        with PlanRunner(backend="auto", arch=HOST) as runner:
            (out,) = run_plan(plan, [x], runner)
        with load_program(compiled, backend="auto") as program:
            (again,) = program("addc", x)
    np.testing.assert_array_equal(out, x + np.float32(1.5))
    np.testing.assert_array_equal(again, out)

    const = tmp_path / "const.mlir"
    const.write_text(ADD_CONST)
    compiled = compile_program(const, HOST, compile_cache)
    seen.clear()
    ones = [np.ones(300, np.float32)]
    run_plan(plan_program(compiled, ones, "addc"), ones, check)
    assert len(seen) == 3 and set(seen) == {0}
