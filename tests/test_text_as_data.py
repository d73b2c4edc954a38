"""Text from guests and programs is data: what a guest writes to its stderr,
a compiled program's function names, status messages and reflection
attributes, a plugin's name string read from guest memory reach the
terminal escaped (``\\x1b``, ``\\n``), bounded and behind labels, never as
escape sequences or as a line that reads as ``hal-cpu``'s own.

The artifacts are real: a ``.vmfb`` compiled by the pinned ``iree-compile``
whose names and messages are then replaced in place by hostile text of the
same length (the FlatBuffer stores strings with their length; the ZIP
members' CRCs are written again), and a plugin built from C with zig whose
name holds escape sequences, or whose query writes a forged report to
stderr and ends its process (the qemu engine's guest agent dies; its
stderr is quoted in the error)."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest

import elfloader
from elfloader.backend.emulated import qemu_program
from fatelf.text import for_terminal, one_line, printable, printable_lines
from hal_cpu.buildtools import zig as zigbuild
from hal_cpu.cli import main
from hal_cpu.programs import compile_program

from conftest import ROOT

ESC = "\x1b"
#: What hostile text holds: clear the screen, a forged error line, green.
CORE = b"\x1b[2J\nhal-cpu: error: forged\x1b[32m"

PROGRAM = """
func.func @FNAMEFNAMEFNAMEFNAMEFNAMEFNAMEFNAME(%arg0: tensor<4xf32>) -> tensor<4xf32>
    attributes {iree.reflection = {iree.abi.declaration =
                "DECLDECLDECLDECLDECLDECLDECLDECLDECL"}} {
  %0 = arith.addf %arg0, %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @fails(%arg0: i32) -> i32 {
  util.status.check_ok %arg0, "MSGMSGMSGMSGMSGMSGMSGMSGMSGMSGMSGMSG"
  return %arg0 : i32
}
"""
PLACEHOLDERS = (b"FNAMEFNAMEFNAMEFNAMEFNAMEFNAMEFNAME",
                b"DECLDECLDECLDECLDECLDECLDECLDECLDECL",
                b"MSGMSGMSGMSGMSGMSGMSGMSGMSGMSGMSGMSG")


def hostile(n: int) -> bytes:
    """``n`` bytes ending with :data:`CORE`."""
    return b"f" * (n - len(CORE)) + CORE


#: The function's name in the hostile module.
FUNCTION = hostile(len(PLACEHOLDERS[0])).decode()


def _fix_crcs(data: bytearray) -> None:
    """Write each stored member's CRC-32 again, in its local header and its
    central directory entry (found by signature: the file is ZIP64)."""
    crcs = {}
    for info in zipfile.ZipFile(io.BytesIO(bytes(data))).infolist():
        lh = info.header_offset
        nlen, xlen = struct.unpack_from("<HH", data, lh + 26)
        start = lh + 30 + nlen + xlen
        crc = zlib.crc32(data[start:start + info.compress_size])
        struct.pack_into("<I", data, lh + 14, crc)
        crcs[info.filename.encode("utf-8", "surrogateescape")] = crc
    pos = data.find(b"PK\x01\x02")
    while pos >= 0:
        nlen = struct.unpack_from("<H", data, pos + 28)[0]
        struct.pack_into("<I", data, pos + 16, crcs[bytes(data[pos + 46:pos + 46 + nlen])])
        pos = data.find(b"PK\x01\x02", pos + 46)


@pytest.fixture(scope="module")
def evil_vmfb(tmp_path_factory, compile_cache):
    """A host ``.vmfb`` whose function name (also in its executable's
    names and its ZIP member names), declaration and status message hold
    :data:`CORE`."""
    work = tmp_path_factory.mktemp("text_as_data")
    source = work / "evil.mlir"
    source.write_text(PROGRAM)
    data = compile_program(source, elfloader.arch.host().name,
                           compile_cache).vmfb.read_bytes()
    for placeholder in PLACEHOLDERS:
        assert placeholder in data
        data = data.replace(placeholder, hostile(len(placeholder)))
    patched = bytearray(data)
    _fix_crcs(patched)
    path = work / "evil.vmfb"
    path.write_bytes(bytes(patched))
    assert zipfile.ZipFile(path).testzip() is None
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_data(out: str, err: str, errors: int) -> None:
    """No escape character anywhere; no line of either stream that starts
    as the tool's own but the ``errors`` error lines of stderr."""
    for text in (out, err):
        assert ESC not in text
        assert "\x9b" not in text
    own = [line for line in (out + "\n" + err).splitlines()
           if line.startswith("hal-cpu:")]
    assert len(own) == errors, own
    assert all(line.startswith("hal-cpu: error: ") for line in own)


# -- the helpers ---------------------------------------------------------------

def test_printable_makes_one_line_of_data():
    text = printable(CORE + b"\\ \xff", 400)
    assert text == "\\x1b[2J\\nhal-cpu: error: forged\\x1b[32m\\\\ \\xff"
    assert "\n" not in printable("a\u2028b\u202ec") and ESC not in text
    assert printable("x" * 500, 10) == "x" * 10 + "... (490 more characters)"
    assert one_line(one_line(CORE.decode())) == one_line(CORE.decode())
    lines = printable_lines(CORE + b"\nsecond", "  guest| ").splitlines()
    assert lines == ["  guest| \\x1b[2J", "  guest| hal-cpu: error: forged\\x1b[32m",
                     "  guest| second"]


def test_for_terminal_keeps_reports_and_marks_forged_lines():
    report = "hal-cpu: error: k.so: x86_64: fault\n  pc:           0x10\tx"
    assert for_terminal(report, "hal-cpu") == report
    shown = for_terminal("hal-cpu: error: a\x1b[2J\nhal-cpu: error: b\x9b", "hal-cpu")
    assert shown == "hal-cpu: error: a\\x1b[2J\n| hal-cpu: error: b\\x9b"


# -- compiled programs ---------------------------------------------------------

def test_status_message_is_escaped(capsys, evil_vmfb):
    rc, out, err = run(capsys, "run-module", f"--module={evil_vmfb}",
                       "--function=fails", "--input=1")
    assert rc == 1
    assert_data(out, err, 1)
    assert "CANCELLED; " in err and "\\x1b[2J\\nhal-cpu: error: forged" in err


def test_function_names_and_declaration_are_escaped(capsys, evil_vmfb):
    # the names listed by a failed lookup
    rc, out, err = run(capsys, "run-module", f"--module={evil_vmfb}", "--function=nope")
    assert rc == 1
    assert_data(out, err, 1)
    # the declaration (iree.abi.declaration) quoted by a wrong input count
    rc, out, err = run(capsys, "run-module", f"--module={evil_vmfb}",
                       f"--function={FUNCTION}")
    assert rc == 1
    assert_data(out, err, 1)
    assert "takes 1 inputs (ffff\\x1b[2J" in err
    # a run: EXEC line and result
    rc, out, err = run(capsys, "run-module", f"--module={evil_vmfb}",
                       f"--function={FUNCTION}", "--input=4xf32=1")
    assert rc == 0, err
    assert_data(out, err, 0)
    assert out.splitlines()[0] == "EXEC @" + printable(FUNCTION)
    assert "4xf32=2 2 2 2" in out


def test_check_module_plan_and_benchmark_show_names_escaped(capsys, evil_vmfb):
    rc, out, err = run(capsys, "check-module", f"--module={evil_vmfb}")
    assert rc == 0, err
    assert_data(out, err, 0)
    rc, out, err = run(capsys, "plan", evil_vmfb, f"--function={FUNCTION}",
                       "--input=4xf32=1", "--trace")
    assert rc == 0, err
    assert_data(out, err, 0)
    assert out.startswith("@" + printable(FUNCTION))
    rc, out, err = run(capsys, "benchmark-module", f"--module={evil_vmfb}",
                       f"--function={FUNCTION}", "--input=4xf32=1",
                       "--benchmark_min_time=0.01")
    assert rc == 0, err
    assert_data(out, err, 0)


def test_inspect_of_the_module_shows_its_names_escaped(capsys, evil_vmfb):
    rc, out, err = run(capsys, "inspect", evil_vmfb)
    assert rc == 0, err
    assert_data(out, err, 0)
    # every name of the executable (member, library, export) is one line
    assert sum("\\x1b[2J\\nhal-cpu: error: forged" in line
               for line in out.splitlines()) >= 4


# -- plugins and guests ------------------------------------------------------------

PLUGIN = r"""
#include "hostile_syscall.h"
#include "plugin_abi.h"

static iree_hal_executable_plugin_status_t p_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment; (void)param_count; (void)params;
  *out_self = 0;
  return 0;
}

static void p_unload(void* self) { (void)self; }

static iree_hal_executable_plugin_status_t p_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self; (void)params;
  *out_resolution = 0;
  return 0;
}

static const iree_hal_executable_plugin_header_t header = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "\x1b[2J\nhal-cpu: error: forged\x1b[32m",
    .description = "plugin\nhal-cpu: all 6 architectures PASSED\x1b[0m",
};

static const iree_hal_executable_plugin_v0_t plugin = {
    .header = &header, .load = p_load, .unload = p_unload,
    .resolve = p_resolve};

#ifdef SAY_AND_EXIT
static const char said[] =
    "\x1b[2J\x1b[32mhal-cpu: all 6 architectures PASSED\x1b[0m\n"
    "hal-cpu: error: forged\n";
#endif

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)max_version; (void)reserved;
#ifdef SAY_AND_EXIT
  hs_call3(NR_write, 2, said, sizeof said - 1);
  hs_call1(NR_exit_group, 3);
#endif
  return (const iree_hal_executable_plugin_header_t**)&plugin;
}
"""

ARCH = "aarch64"


def _plugin(tmp_path, name: str, defines=()) -> str:
    if not zigbuild.zig_available():
        pytest.skip("zig is not installed")
    source = tmp_path / f"{name}.c"
    source.write_text(PLUGIN)
    out = tmp_path / f"{name}.so"
    zigbuild.build_plugin_file([source], out, ARCH, defines=list(defines),
                               include_dirs=[str(ROOT / "tests" / "plugins")])
    return str(out)


needs_qemu = pytest.mark.skipif(
    qemu_program(elfloader.arch.by_name(ARCH)) is None,
    reason="qemu-user is not installed")


@needs_qemu
def test_inspect_shows_a_plugins_name_escaped(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PKR_ENGINE", "qemu")
    path = _plugin(tmp_path, "named")
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 0, err
    assert_data(out, err, 0)
    assert "plugin:       \\x1b[2J\\nhal-cpu: error: forged\\x1b[32m (version" in out
    assert "description:  plugin\\nhal-cpu: all 6 architectures PASSED\\x1b[0m" in out


@needs_qemu
def test_a_guests_stderr_is_quoted_as_data(capsys, tmp_path, monkeypatch):
    """The query writes a forged success line and error line, in colour,
    to stderr and ends the guest agent: the error quotes what it wrote,
    each line behind a label, escaped; one error line is the tool's."""
    monkeypatch.setenv("PKR_ENGINE", "qemu")
    path = _plugin(tmp_path, "says", ["-DSAY_AND_EXIT=1"])
    rc, out, err = run(capsys, "inspect", path)
    assert rc == 1
    assert_data(out, err, 1)
    quoted = [line for line in err.splitlines() if "guest agent stderr| " in line]
    assert quoted and all(line.startswith("  guest agent stderr| ") for line in quoted)
    assert any("\\x1b[2J\\x1b[32mhal-cpu: all 6 architectures PASSED\\x1b[0m" in line
               for line in quoted)
    assert "PASSED" not in out
