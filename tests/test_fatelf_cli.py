"""Tests of the ``fatelf`` command line tool, run as ``python -m fatelf``."""

from __future__ import annotations

import argparse
import os
import pty
import select
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import fatelf
from fatelf import cli

from conftest import default_sigint

REPO = Path(__file__).resolve().parent.parent
# The bundle used by the CLI tests: four architectures.
ZIG_TARGETS = ("x86_64", "aarch64", "riscv64", "x86_32")


@pytest.fixture()
def bundle_file(tmp_path, elf_files) -> Path:
    path = tmp_path / "bundle.sos"
    path.write_bytes(fatelf.join([elf_files[k].read_bytes() for k in ZIG_TARGETS]))
    return path


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _argv(args) -> list[str]:
    return [sys.executable, "-m", "fatelf", *map(str, args)]


def run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(args), capture_output=True, env=_env(), cwd=cwd, timeout=60)


def run_on_terminal(*args) -> tuple[subprocess.CompletedProcess, bytes]:
    """Run with a pseudo-terminal as stdout; returns the process (stderr
    captured) and what it wrote to the terminal."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(_argv(args), stdout=slave, stderr=subprocess.PIPE,
                              env=_env(), timeout=60)
    finally:
        os.close(slave)
    shown = b""
    try:
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    return proc, shown


def assert_one_line_failure(proc, *fragments):
    assert proc.returncode == 1, proc
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fatelf: ")
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# --------------------------------------------------------------------------


def test_join_to_file_and_stdout(tmp_path, elf_files):
    inputs = [elf_files[k] for k in ("riscv64", "x86_64", "aarch64")]
    expected = fatelf.join([p.read_bytes() for p in inputs])
    out = tmp_path / "j.sos"
    proc = run("join", "-o", out, *inputs)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == expected
    proc = run("join", *inputs)
    assert proc.returncode == 0 and proc.stdout == expected


def test_join_errors(tmp_path, elf_files):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an elf at all")
    assert_one_line_failure(run("join", "-o", tmp_path / "x", elf_files["x86_64"], junk),
                            f"{junk}: e_ident[EI_MAG]: not an ELF file (starts with 6e 6f 74 20")
    assert_one_line_failure(run("join", elf_files["x86_64"], elf_files["x86_64_v2"]),
                            f"{elf_files['x86_64_v2']}: target: same target as "
                            f"{elf_files['x86_64']}")
    assert_one_line_failure(run("join", tmp_path / "missing.so"), "missing.so")


def test_split_then_join_round_trip(tmp_path, bundle_file, elf_files):
    outdir = tmp_path / "parts"
    proc = run("split", bundle_file, "--output-dir", outdir)
    assert proc.returncode == 0, proc.stderr
    printed = [Path(line) for line in proc.stdout.decode().splitlines()]
    expected = {outdir / f"bundle_{arch}.so": arch for arch in ZIG_TARGETS}
    assert set(printed) == set(expected)
    for path, arch in expected.items():
        assert path.read_bytes() == elf_files[arch].read_bytes()
    rejoined = tmp_path / "rejoined.sos"
    assert run("join", "-o", rejoined, *printed).returncode == 0
    assert rejoined.read_bytes() == bundle_file.read_bytes()


def test_split_defaults_to_bundle_directory(bundle_file):
    proc = run("split", bundle_file)
    assert proc.returncode == 0
    assert (bundle_file.parent / "bundle_aarch64.so").exists()


def test_split_disambiguates_shared_arch(tmp_path, elf_files):
    elf = elf_files["x86_64"].read_bytes()
    linux = bytearray(elf)
    linux[7] = 3
    path = tmp_path / "two.fat"
    path.write_bytes(fatelf.join([elf, bytes(linux)]))
    proc = run("split", path)
    assert proc.returncode == 0, proc.stderr
    names = sorted(Path(p).name for p in proc.stdout.decode().split())
    assert names == ["two_x86_64_linux_osabiver0.so", "two_x86_64_none_osabiver0.so"]


def test_select_and_extract_exact_bytes(tmp_path, bundle_file, elf_files):
    for arch in ZIG_TARGETS:
        proc = run("select", bundle_file, "--arch", arch)
        assert proc.returncode == 0 and proc.stdout == elf_files[arch].read_bytes()
        out = tmp_path / f"{arch}.so"
        assert run("extract", bundle_file, "--arch", arch, "-o", out).returncode == 0
        assert out.read_bytes() == elf_files[arch].read_bytes()
    proc = run("select", bundle_file, "--arch", "i686")
    assert proc.stdout == elf_files["x86_32"].read_bytes()
    proc = run("extract", bundle_file, "--arch", "record2")  # x86_32, x86_64, aarch64, ...
    assert proc.returncode == 0 and proc.stdout == elf_files["aarch64"].read_bytes()
    proc = run("extract", bundle_file, "--arch", "arm64:le:none:osabiver0")
    assert proc.stdout == elf_files["aarch64"].read_bytes()


def test_select_host_default_and_passthrough(bundle_file, elf_files):
    host = fatelf.host_arch()
    proc = run("select", bundle_file)
    if host in ZIG_TARGETS:
        assert proc.returncode == 0 and proc.stdout == elf_files[host].read_bytes()
    else:
        assert_one_line_failure(proc, "no record for")
    plain = elf_files["riscv64"]
    proc = run("select", plain, "--arch", "x86_64")
    assert proc.returncode == 0 and proc.stdout == plain.read_bytes()


def test_select_and_extract_failures(tmp_path, bundle_file):
    assert_one_line_failure(run("select", bundle_file, "--arch", "arm32"),
                            "no record for arm32", "the bundle holds: x86_32, x86_64")
    assert_one_line_failure(run("select", bundle_file, "--arch", "sparc"),
                            f"{bundle_file}: arch: unknown architecture 'sparc'")
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello")
    assert_one_line_failure(run("select", text), f"{text}: e_ident[EI_MAG]: not an ELF file",
                            "and not a FatELF either")
    assert_one_line_failure(run("extract", bundle_file, "--arch", "arm32"),
                            f"{bundle_file}: target: no record matches 'arm32'")
    assert_one_line_failure(run("extract", bundle_file, "--arch", "record9"),
                            "record: 9 does not exist")
    assert_one_line_failure(run("extract", bundle_file, "--arch", "x86_64:weird"),
                            "target: unknown qualifier 'weird'")


def test_extract_ambiguous_target(tmp_path, elf_files):
    elf = elf_files["x86_64"].read_bytes()
    linux = bytearray(elf)
    linux[7] = 3
    path = tmp_path / "two.sos"
    path.write_bytes(fatelf.join([elf, bytes(linux)]))
    assert_one_line_failure(run("extract", path, "--arch", "x86_64"), "ambiguous")
    proc = run("extract", path, "--arch", "x86_64:linux")
    assert proc.returncode == 0 and proc.stdout == bytes(linux)
    assert run("verify", path, "--arch", "x86_64").returncode == 0


def test_dump_prints_every_field(bundle_file):
    proc = run("dump", bundle_file)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode()
    assert "magic: 1F0E70FA" in out
    assert "version: 1" in out and "records: 4" in out and "reserved: 00" in out
    fat = fatelf.read(bundle_file)
    for i, rec in enumerate(fat.records):
        block = out.split(f"fatelf_record[{i}]:")[1].split("\n\n")[0]
        assert f"machine: {rec.machine} / {rec.machine:04X} = EM_" in block
        assert "osabi: 0 / 00 = none" in block
        assert f"word_size: {1 if rec.word_size == 32 else 2} / " in block
        assert "byte_order: 1 / 01 = ELFDATA2LSB (little-endian)" in block
        assert "reserved0: 0 / 00" in block and "reserved1: 0 / 00" in block
        assert f"offset: {rec.offset} / {rec.offset:016X}" in block
        assert f"size: {rec.size} / {rec.size:016X}" in block


def test_dump_of_invalid_bundle_shows_fields_then_fails(tmp_path, bundle_file):
    data = bytearray(bundle_file.read_bytes())
    data[8 + 24 + 6] = 7  # record 1 reserved0
    bad = tmp_path / "bad.sos"
    bad.write_bytes(bytes(data))
    proc = run("dump", bad)
    assert "reserved0: 7 / 07" in proc.stdout.decode()
    assert_one_line_failure(proc, f"{bad}: record 1.reserved0: 0x07 is not zero")


def test_info_and_validate(bundle_file):
    proc = run("info", bundle_file)
    assert proc.returncode == 0
    out = proc.stdout.decode()
    assert "FatELF format version 1" in out and "4 records." in out
    assert "Target name: 'riscv64' or 'record3'" in out
    assert "Machine 62 (EM_X86_64)" in out
    proc = run("validate", bundle_file)
    assert proc.returncode == 0
    assert "valid FatELF version 1, 4 records: x86_32, x86_64, aarch64, riscv64" in \
        proc.stdout.decode()


def test_verify(bundle_file):
    assert run("verify", bundle_file, "--arch", "aarch64").returncode == 0
    assert run("verify", bundle_file, "--arch", "x86").returncode == 0
    proc = run("verify", bundle_file, "--arch", "riscv32")
    assert_one_line_failure(proc, "no record for target 'riscv32'")


def test_remove_to_output_and_in_place(tmp_path, bundle_file, elf_files):
    original = bundle_file.read_bytes()
    out = tmp_path / "less.sos"
    proc = run("remove", bundle_file, "--arch", "aarch64", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert bundle_file.read_bytes() == original  # input untouched with -o
    assert fatelf.read(out).arches == ["x86_32", "x86_64", "riscv64"]
    assert out.read_bytes() == fatelf.join(
        [elf_files[k].read_bytes() for k in ("x86_32", "x86_64", "riscv64")])
    assert run("remove", bundle_file, "--arch", "record0").returncode == 0
    assert fatelf.read(bundle_file).arches == ["x86_64", "aarch64", "riscv64"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fatelf-")]
    assert_one_line_failure(run("remove", bundle_file, "--arch", "arm32"), "no record")


def test_replace(tmp_path, bundle_file, elf_files):
    new = elf_files["x86_64_v2"]
    out = tmp_path / "new.sos"
    proc = run("replace", bundle_file, new, "-o", out)
    assert proc.returncode == 0, proc.stderr
    fat = fatelf.read(out)
    assert fat.select("x86_64") == new.read_bytes()
    assert fat.select("aarch64") == elf_files["aarch64"].read_bytes()
    assert fatelf.read(bundle_file).select("x86_64") == elf_files["x86_64"].read_bytes()
    assert run("replace", bundle_file, new).returncode == 0  # in place
    assert bundle_file.read_bytes() == out.read_bytes()
    only = tmp_path / "only.sos"
    only.write_bytes(fatelf.join([elf_files["aarch64"].read_bytes()]))
    assert_one_line_failure(run("replace", only, new), "no record of", "has its target")


# --------------------------------------------------------------------------
# Invalid input: one line on stderr, exit status 1.


def _mutations(data: bytes) -> dict[str, bytes]:
    def rec(data, index, at, raw):
        b = bytearray(data)
        pos = 8 + 24 * index + at
        b[pos:pos + len(raw)] = raw
        return bytes(b)

    n = data[6]
    first = int.from_bytes(data[8 + 8:8 + 16], "little")
    return {
        "truncated header": data[:6],
        "truncated record table": data[:8 + 24 * n - 3],
        "unknown version": data[:4] + b"\x02\x00" + data[6:],
        "zero records": data[:6] + b"\x00" + data[7:],
        "outside file": rec(data, 1, 16, (1 << 40).to_bytes(8, "little")),
        "overlap": rec(data, 1, 8, first.to_bytes(8, "little")),
        "duplicate target": rec(data, 1, 0, data[8:10]),
        "disagrees with ELF": rec(data, 0, 2, b"\x03"),
        "not an ELF": data[:first] + b"\0\0\0\0" + data[first + 4:],
    }


INVALID_CASES = ["truncated header", "truncated record table", "unknown version",
                 "zero records", "outside file", "overlap", "duplicate target",
                 "disagrees with ELF", "not an ELF", "not FatELF"]


@pytest.mark.parametrize("case", INVALID_CASES)
def test_invalid_bundles_fail_with_one_line(tmp_path, bundle_file, case):
    data = bundle_file.read_bytes()
    bad = tmp_path / "bad.sos"
    content = b"plain text" if case == "not FatELF" else _mutations(data)[case]
    bad.write_bytes(content)
    line = assert_one_line_failure(run("validate", bad), str(bad))
    assert line.startswith(f"fatelf: {bad}: ")
    # every other reading command fails the same way; spread them over the
    # cases to keep the number of subprocesses down
    others = [["info", bad], ["split", bad, "--output-dir", tmp_path / "o"],
              ["extract", bad, "--arch", "x86_64"], ["verify", bad, "--arch", "x86_64"],
              ["remove", bad, "--arch", "x86_64"], ["replace", bad, bad],
              ["dump", bad], ["select", bad, "--arch", "x86_64"]]
    cmd = others[INVALID_CASES.index(case) % len(others)]
    if not (cmd[0] == "select" and case == "not FatELF"):
        assert_one_line_failure(run(*cmd), str(bad))
    assert bad.read_bytes() == content  # never rewritten
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["extract", "x.sos"],
                                  ["join"], ["verify", "x.sos"], ["select"],
                                  ["info", "x.sos", "--bogus"]])
def test_usage_errors_exit_2(argv):
    proc = run(*argv)
    assert proc.returncode == 2
    assert b"usage:" in proc.stderr


def test_version():
    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == f"fatelf {metadata.version('portable-kernel-runtime')}\n"


def test_every_option_and_positional_has_help():
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {"join", "split", "select", "dump", "info", "validate",
                                     "extract", "remove", "replace", "verify"}
    for name, p in [("fatelf", parser), *commands.choices.items()]:
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, (name, action.dest)
    proc = run("replace", "--help")
    assert proc.returncode == 0 and b"the ELF to put in place" in proc.stdout


@pytest.mark.parametrize("command", ["join", "select", "extract"])
def test_binary_output_to_a_terminal_is_refused(tmp_path, bundle_file, elf_files, command):
    args = {"join": ["join", elf_files["x86_64"]],
            "select": ["select", bundle_file, "--arch", "x86_64"],
            "extract": ["extract", bundle_file, "--arch", "x86_64"]}[command]
    proc, shown = run_on_terminal(*args)
    assert proc.returncode == 2
    assert proc.stderr.decode() == ("fatelf: refusing to write binary data to a terminal; "
                                    "use -o FILE or redirect\n")
    assert shown == b""
    out = tmp_path / "out.bin"
    proc, shown = run_on_terminal(*args, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert shown == b"" and out.read_bytes()[:4] in (b"\x7fELF", bytes.fromhex("FA700E1F"))


def test_text_output_to_a_terminal_is_fine(bundle_file):
    proc, shown = run_on_terminal("validate", bundle_file)
    assert proc.returncode == 0, proc.stderr
    assert b"valid FatELF version 1" in shown


def test_interrupt_exits_130(tmp_path, bundle_file):
    # Ctrl-C while the bundle is being read: SIGINT is sent by the process
    # itself at that moment (a real input never blocks: FIFOs are refused).
    code = ("import os, signal, sys\n"
            "from fatelf import cli\n"
            "read = cli._read\n"
            "def interrupted(path):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    return read(path)\n"
            "cli._read = interrupted\n"
            f"sys.exit(cli.main(['info', {str(bundle_file)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          env=_env(), timeout=60, preexec_fn=default_sigint)
    assert proc.returncode == 130
    assert proc.stderr.decode() == "fatelf: interrupted\n"
    assert proc.stdout == b""


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_non_regular_inputs_are_refused_at_once(tmp_path, kind):
    path = {"device": Path("/dev/zero"), "directory": tmp_path}.get(kind)
    if path is None:
        path = tmp_path / "in.sos"
        os.mkfifo(path)
    for command in (["info", path], ["validate", path], ["split", path]):
        proc = run(*command, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        err = proc.stderr.decode()
        assert err.count("\n") == 1 and "not a regular file" in err, err


@pytest.mark.parametrize("command", ["join", "info"])
def test_closed_stdout_ends_quietly(bundle_file, elf_files, command):
    args = {"join": ["join", *(elf_files[k] for k in ZIG_TARGETS)],
            "info": ["info", bundle_file]}[command]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(_argv(args), stdout=write_end, stderr=subprocess.PIPE,
                              env=_env(), timeout=60)
    finally:
        os.close(write_end)
    assert proc.stderr == b""
    assert proc.returncode == 1


def test_any_portable_kernel_error_is_one_line(monkeypatch, capsys, bundle_file):
    def boom(args):
        raise fatelf.PortableKernelError("went wrong\nbadly", name="x.so", field="e_machine",
                                         value=7)

    monkeypatch.setattr(cli, "cmd_info", boom)
    assert cli.main(["info", str(bundle_file)]) == 1
    assert capsys.readouterr().err == "fatelf: x.so: e_machine: went wrong badly\n"


def test_missing_file(tmp_path):
    assert_one_line_failure(run("info", tmp_path / "nope.sos"), "nope.sos",
                            "No such file")
