"""A program loaded again in the same process: what was verified is reused
by content, never by name alone.

* :func:`read_module` keeps verified modules by label, file size and the
  bytes of the container header and FlatBuffer: reading the same file
  again gives an equal module over the new mapping, a label of its own,
  and a file changed in place (another program, a damaged FlatBuffer, a
  truncated tail whose read-only data now lies outside it) is verified
  again and refused as before.
* :func:`elfloader.read_image` keeps verified images by bytes, name and
  architecture: the same bytes give the same image, damaged bytes are
  refused.
* ``load_program`` of a path whose file was replaced runs the new program.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import elfloader
from hal_cpu.programs import compile_program
from hal_cpu.programs.vm import load_program
from hal_cpu.programs.vm.module_def import ModuleFormatError, read_module

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"

CONSTANT = """
module @constant {
  func.func @get() -> i64 {
    %c = arith.constant VALUE : i64
    %v = util.optimization_barrier %c : i64
    return %v : i64
  }
}
"""

native_x86_64 = pytest.mark.skipif(
    __import__("os").uname().machine not in ("x86_64", "AMD64"),
    reason="the programs are compiled for x86_64 and run natively")


@pytest.fixture(scope="module")
def mlp(compile_cache) -> Path:
    return Path(compile_program(ROOT / "bench" / "programs" / "mlp.mlir", "x86_64",
                                compile_cache).vmfb)


@pytest.fixture(scope="module")
def constants(compile_cache, tmp_path_factory) -> dict[int, Path]:
    """``.vmfb`` files of @get returning 7 and 8 (x86_64)."""
    out = {}
    folder = tmp_path_factory.mktemp("constants")
    for value in (7, 8):
        source = folder / f"constant{value}.mlir"
        source.write_text(CONSTANT.replace("VALUE", str(value)))
        out[value] = Path(compile_program(source, "x86_64", compile_cache).vmfb)
    return out


def test_a_module_read_again_is_equal_and_has_its_own_label(constants, tmp_path):
    path = tmp_path / "a.vmfb"
    shutil.copyfile(constants[7], path)
    first = read_module(path)
    again = read_module(path)
    assert again == first and again.source == str(path)
    assert bytes(again.bytecode) == bytes(first.bytecode)
    named = read_module(path, name="other.vmfb")
    assert named.source == "other.vmfb"
    assert (named.functions, named.imports, named.exports, named.rodata) == (
        first.functions, first.imports, first.exports, first.rodata)
    from_bytes = read_module(path.read_bytes())
    assert from_bytes.source == "<memory>" and from_bytes.functions == first.functions


def test_a_file_changed_in_place_is_verified_again(constants, tmp_path):
    path = tmp_path / "a.vmfb"
    shutil.copyfile(constants[7], path)
    good = path.read_bytes()
    read_module(path)

    shutil.copyfile(constants[8], path)      # another program, same name
    assert read_module(path).bytecode.tobytes() == read_module(constants[8]).bytecode.tobytes()

    data = bytearray(good)
    start = 30 + int.from_bytes(data[26:28], "little") + int.from_bytes(data[28:30], "little")
    data[start + 4:start + 8] = (1 << 31).to_bytes(4, "little")   # root offset
    path.write_bytes(bytes(data))
    with pytest.raises(ModuleFormatError) as err:
        read_module(path)
    assert err.value.name == str(path) and err.value.field == "root"


def test_a_file_cut_short_is_verified_again(mlp, tmp_path):
    """The file's size is part of what was verified: the executable the
    module embeds behind its FlatBuffer must lie inside the file."""
    path = tmp_path / "mlp.vmfb"
    shutil.copyfile(mlp, path)
    mdef = read_module(path)
    external = [seg for seg in mdef.rodata if seg.external]
    assert external, "the program embeds its executable behind the FlatBuffer"
    path.write_bytes(mlp.read_bytes()[:external[0].offset + 1])    # tail cut off
    with pytest.raises(ModuleFormatError) as err:
        read_module(path)
    assert err.value.field.startswith("rodata_segments[")


def test_an_elf_image_is_verified_once_per_content_and_name():
    data = (SAMPLES / "mul_add_x86_64.so").read_bytes()
    first = elfloader.read_image(data, arch="x86_64", name="k.so")
    assert elfloader.read_image(bytes(data), arch="x86_64", name="k.so") is first
    other = elfloader.read_image(data, arch="x86_64", name="other.so")
    assert other is not first and other.name == "other.so"
    assert elfloader.read_image(data, name="k.so").name == "k.so"
    with pytest.raises(elfloader.ArchitectureMismatchError):
        elfloader.read_image(data, arch="aarch64", name="k.so")
    bad = bytearray(data)
    bad[4] = 9                                                  # EI_CLASS
    with pytest.raises(elfloader.ElfError) as err:
        elfloader.read_image(bytes(bad), arch="x86_64", name="k.so")
    assert err.value.name == "k.so"


@native_x86_64
def test_load_program_of_a_replaced_file_runs_the_new_program(constants, tmp_path):
    path = tmp_path / "p.vmfb"
    for value in (7, 7, 8, 7):
        shutil.copyfile(constants[value], path)
        with load_program(path) as program:
            assert int(program("get")[0]) == value
