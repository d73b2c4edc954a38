"""Native runs are confined by default: a system-library plugin built with
zig whose workgroup function tries to create a file, open a socket, start a
process and exec a program is refused under every command (``run``,
``run-module`` on MLIR and on a ``.vmfb`` without ``--arch``,
``check-module``, ``benchmark-module``, ``plan --trace``), and the command
reports it in one error line; with ``--run_native`` (or ``--no_sandbox``)
the same plugin creates its file. A plugin that dereferences NULL ends the
child, not ``hal-cpu`` (exit status 1, one error line). A plugin that
prints, allocates, reads the clock and runs on several dispatch threads,
and the system-plugin sample, still work confined. Confinement is paid
once per child: ``benchmark-module`` does not fork per call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elfloader
from elfloader.backend.emulated import sandbox
from hal_cpu import isolate
from hal_cpu.errors import HalCpuError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "sample_plugins" / "system_example.mlir"
SYSTEM_SO = ROOT / "sample_plugins" / "prebuilt" / "system_plugin_x86_64.so"
HOST = elfloader.arch.host()

pytestmark = [
    pytest.mark.skipif(HOST is None or HOST.name != "x86_64",
                       reason="the plugins are built for an x86_64 Linux host"),
    pytest.mark.skipif(not sandbox.status()["seccomp"],
                       reason="no seccomp filter on this machine"),
]

#: system_mul_workgroup (the import system_example.mlir calls) in three
#: moods: HOSTILE tries to reach the host on its first call and fails the
#: dispatch when refused; CRASH stores through NULL; POLITE prints,
#: allocates and reads the clock on every call.
SOURCE = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sample_common.h"

static int reach_host(void) {
  const char* dir = getenv("CONFINEMENT_MARKER_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/created", dir ? dir : "/nonexistent");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int create = fd >= 0 ? 0 : errno;
  if (fd >= 0) close(fd);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int sock = s >= 0 ? 0 : errno;
  if (s >= 0) close(s);
  pid_t pid = fork();
  int proc = pid >= 0 ? 0 : errno;
  if (pid == 0) _exit(0);
  if (pid > 0) waitpid(pid, NULL, 0);
  char* argv[] = {"/nonexistent-program", NULL};
  execve(argv[0], argv, NULL);          /* ENOENT when allowed */
  int exec = errno;
  fprintf(stderr, "hostile plugin: create: %s; socket: %s; fork: %s; "
          "exec: %s\n", create ? strerror(create) : "done",
          sock ? strerror(sock) : "done", proc ? strerror(proc) : "done",
          strerror(exec));
  return create || sock || proc || exec == EPERM;
}

static int system_mul_workgroup(void* params_ptr, void* context,
                                void* reserved) {
  (void)context; (void)reserved;
  const mul_params_t* p = (const mul_params_t*)params_ptr;
#if defined(HOSTILE)
  static int refused = -1;
  if (__atomic_load_n(&refused, __ATOMIC_ACQUIRE) < 0)
    __atomic_store_n(&refused, reach_host(), __ATOMIC_RELEASE);
  if (refused) return 13;
#elif defined(CRASH)
  *(volatile int*)0 = 42;
#elif defined(POLITE)
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char* note = malloc(1 << 20);
  if (!note) return 12;
  snprintf(note, 1 << 20, "polite plugin: workgroup %zu at %ld s", p->tid,
           (long)ts.tv_sec);
  printf("%s (stdout)\n", note);
  fflush(stdout);
  fprintf(stderr, "%s (stderr)\n", note);
  free(note);
#endif
  size_t begin, end;
  if (!tile_range(p->dim, p->tid, &begin, &end)) return 0;
  const float* lhs = p->binding0 + p->binding0_offset;
  const float* rhs = p->binding1 + p->binding1_offset;
  float* out = p->binding2 + p->binding2_offset;
  for (size_t i = begin; i < end; ++i) out[i] = lhs[i] * rhs[i];
  return 0;
}

static iree_hal_executable_plugin_status_t load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment; (void)param_count; (void)params;
  *out_self = NULL;
  return plugin_status(IREE_HAL_EXECUTABLE_PLUGIN_STATUS_OK);
}

static void unload(void* self) { (void)self; }

static const export_entry_t kExports[] = {
    {"system_mul_workgroup", system_mul_workgroup, 1},
};

static iree_hal_executable_plugin_status_t resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  return resolve_from_table(kExports, sizeof(kExports) / sizeof(kExports[0]),
                            self, params, out_resolution);
}

static const iree_hal_executable_plugin_header_t kHeader = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "confinement_probe",
    .description = "tests/test_native_confinement.py",
    .features = IREE_HAL_EXECUTABLE_PLUGIN_FEATURE_NONE,
    .sanitizer = IREE_HAL_EXECUTABLE_PLUGIN_SANITIZER_NONE,
};

static const iree_hal_executable_plugin_v0_t kPlugin = {
    .header = &kHeader, .load = load, .unload = unload, .resolve = resolve};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)reserved;
  if (max_version < IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1) return NULL;
  return (const iree_hal_executable_plugin_header_t**)&kPlugin;
}
"""

#: A check program calling the plugin through system_example's executable.
CHECK = EXAMPLE.read_text().replace("module @system_example {", """
module @system_check {
  func.func @probe() {
    %a8 = util.unfoldable_constant dense<2.0> : tensor<8xf32>
    %b8 = util.unfoldable_constant dense<4.0> : tensor<8xf32>
    %a = tensor.cast %a8 : tensor<8xf32> to tensor<?xf32>
    %b = tensor.cast %b8 : tensor<8xf32> to tensor<?xf32>
    %r = call @mixed_invocation(%a, %b) : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
    %r8 = tensor.cast %r : tensor<?xf32> to tensor<8xf32>
    check.expect_almost_eq_const(%r8, dense<12.0> : tensor<8xf32>) : tensor<8xf32>
    return
  }
""", 1) if EXAMPLE.exists() else ""

INPUTS = ["--input=8xf32=2", "--input=8xf32=4"]


def _build(work: Path, mood: str) -> Path:
    pytest.importorskip("ziglang")
    out = work / f"{mood.lower()}.so"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target",
                    "x86_64-linux-gnu", "-shared", "-fPIC", "-O1",
                    f"-D{mood}", "-I", str(ROOT / "hal_cpu" / "include"),
                    "-I", str(ROOT / "sample_plugins"), "-o", str(out),
                    str(work / "probe.c")], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, Path]:
    """The three moods of the probe plugin, built with zig."""
    work = tmp_path_factory.mktemp("probe")
    (work / "probe.c").write_text(SOURCE)
    return {mood: _build(work, mood) for mood in ("HOSTILE", "CRASH", "POLITE")}


@pytest.fixture(scope="module")
def programs(compile_cache, tmp_path_factory) -> dict[str, Path]:
    """system_example compiled for x86_64: the MLIR, its .vmfb (copied out
    of the cache), its executable, and a check program using it."""
    from hal_cpu.programs import compile_program
    work = tmp_path_factory.mktemp("programs")
    compiled = compile_program(EXAMPLE, "x86_64", compile_cache)
    vmfb = work / "system_example.vmfb"
    vmfb.write_bytes(compiled.vmfb.read_bytes())
    so = work / "system_example.so"
    so.write_bytes(compiled.so_files[0].read_bytes())
    check = work / "system_check.mlir"
    check.write_text(CHECK)
    return {"mlir": EXAMPLE, "vmfb": vmfb, "so": so, "check": check}


def hal_cpu(*args, markers: Path, cwd: Path | None = None):
    env = dict(os.environ, CONFINEMENT_MARKER_DIR=str(markers))
    return subprocess.run([sys.executable, "-m", "hal_cpu", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=300)


def _commands(programs, plugin: Path, cache: Path) -> dict[str, list]:
    """Each command, running system_example (or its check program, or its
    executable) natively with ``plugin``."""
    flag = f"--executable_plugin={plugin}"
    cache_flag = f"--cache_dir={cache}"
    return {
        "run": ["run", programs["so"], "--entry_point=0",
                "--workgroup_count=1,1,1", "--binding=8xf32=2",
                "--binding=8xf32=4", "--binding=8xf32", "--constant=8",
                "--constant=0", flag],
        "run-module mlir": ["run-module", programs["mlir"], *INPUTS, flag,
                            cache_flag],
        "run-module vmfb": ["run-module", programs["vmfb"], *INPUTS, flag],
        "check-module": ["check-module", programs["check"], flag, cache_flag],
        "benchmark-module": ["benchmark-module", programs["vmfb"], *INPUTS,
                             flag, "--benchmark_min_time=3x"],
        "plan --trace": ["plan", programs["mlir"], *INPUTS, flag, cache_flag,
                         "--trace"],
        "plan vmfb": ["plan", programs["vmfb"], *INPUTS, flag, "--trace"],
    }


COMMANDS = ["run", "run-module mlir", "run-module vmfb", "check-module",
            "benchmark-module", "plan --trace", "plan vmfb"]


@pytest.mark.parametrize("command", COMMANDS)
def test_hostile_plugin_is_refused_by_default(command, plugins, programs,
                                              compile_cache, tmp_path):
    args = _commands(programs, plugins["HOSTILE"], compile_cache)[command]
    proc = hal_cpu(*args, markers=tmp_path)
    assert not (tmp_path / "created").exists(), proc.stderr
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = proc.stderr
    # The plugin saw every attempt refused with EPERM...
    assert ("hostile plugin: create: Operation not permitted; socket: "
            "Operation not permitted; fork: Operation not permitted; exec: "
            "Operation not permitted") in said
    # ... and the command reports the failed dispatch in one error line.
    errors = [line for line in said.splitlines()
              if line.startswith("hal-cpu: error:")]
    assert len(errors) == 1, said
    assert "export mul returned 13" in errors[0], errors


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", ["--run_native", "--no_sandbox"])
def test_run_native_opts_out(command, flag, plugins, programs, compile_cache,
                             tmp_path):
    if flag == "--no_sandbox" and command not in ("run", "run-module vmfb"):
        pytest.skip("the alias is checked on two commands")
    args = _commands(programs, plugins["HOSTILE"], compile_cache)[command]
    proc = hal_cpu(*args, flag, markers=tmp_path)
    assert (tmp_path / "created").exists(), proc.stderr
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "create: done; socket: done; fork: done" in proc.stderr


@pytest.mark.parametrize("command", ["run-module vmfb", "run-module mlir",
                                     "check-module", "benchmark-module",
                                     "plan vmfb"])
def test_crashing_plugin_leaves_hal_cpu_alive(command, plugins, programs,
                                              compile_cache, tmp_path):
    """No --arch: the program runs natively, in a child; a store through
    NULL ends that child and hal-cpu says so in one line."""
    args = _commands(programs, plugins["CRASH"], compile_cache)[command]
    proc = hal_cpu(*args, markers=tmp_path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("hal-cpu: error:")]
    assert len(lines) == 1, proc.stderr
    assert "crashed natively (SIGSEGV)" in lines[0]
    assert "malloc()" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["run", "run-module vmfb",
                                     "run-module mlir", "plan --trace"])
def test_polite_plugin_prints_allocates_and_threads_confined(
        command, plugins, programs, compile_cache, tmp_path):
    args = _commands(programs, plugins["POLITE"], compile_cache)[command]
    if command == "run":
        # 130 elements: three workgroups of 64, on three threads.
        args = ["run", programs["so"], "--entry_point=0",
                "--workgroup_count=3,1,1", "--binding=130xf32=2",
                "--binding=130xf32=4", "--binding=130xf32",
                "--constant=130", "--constant=0", "--workers=3", args[-1]]
    proc = hal_cpu(*args, markers=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "polite plugin: workgroup 0 at" in proc.stdout
    assert "(stdout)" in proc.stdout and "(stderr)" in proc.stderr
    if command == "run":
        assert "130xf32=8 8 8" in proc.stdout
        assert {f"workgroup {i} at" in proc.stdout for i in range(3)} == {True}
    elif command.startswith("run-module"):
        assert "8xf32=12 12 12 12 12 12 12 12" in proc.stdout


def test_system_plugin_sample_runs_confined(programs, tmp_path):
    for program in (programs["mlir"], programs["vmfb"]):
        proc = hal_cpu("run-module", program, *INPUTS,
                       f"--executable_plugin={SYSTEM_SO}", markers=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "8xf32=12 12 12 12 12 12 12 12" in proc.stdout


def test_run_in_child_sandbox_is_the_python_api(tmp_path):
    """run_in_child(sandbox=True): what the child may and may not do, and
    errors crossing as plain data with their fields."""
    target = tmp_path / "made"

    def child(_note):
        import socket
        out = {}
        for what, attempt in (("create", lambda: open(target, "w")),
                              ("socket", socket.socket),
                              ("fork", os.fork)):
            try:
                attempt()
                out[what] = "done"
            except OSError as exc:
                out[what] = exc.errno
        print("child prints", flush=True)
        return out

    got = isolate.run_in_child(child, sandbox=True)
    assert got == {"create": 1, "socket": 1, "fork": 1}
    assert not target.exists()

    def fails(_note):
        raise HalCpuError("bad thing", name="f.bin", field="offset", value=7)

    with pytest.raises(HalCpuError) as info:
        isolate.run_in_child(fails, sandbox=True)
    err = info.value
    assert (err.message, err.name, err.field, err.value) == (
        "bad thing", "f.bin", "offset", 7)

    def unpicklable(_note):
        return np.zeros(3)          # a class lookup: not plain data

    with pytest.raises(HalCpuError, match="cannot be sent back|not plain"):
        isolate.run_in_child(unpicklable, sandbox=True)


def test_confinement_is_paid_once_per_benchmark(programs, tmp_path):
    """benchmark-module runs its calls in one child: the confinement's
    cost does not grow with the calls (one fork for 3 or 300 calls)."""
    strace = subprocess.run(["which", "strace"], capture_output=True)
    if strace.returncode != 0:
        pytest.skip("strace is not installed")
    forks = {}
    for count in (3, 300):
        log = tmp_path / f"strace{count}"
        proc = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=clone,clone3,fork,vfork",
             "-o", str(log), sys.executable, "-m", "hal_cpu",
             "benchmark-module", str(programs["vmfb"]), *INPUTS,
             f"--executable_plugin={SYSTEM_SO}",
             f"--benchmark_min_time={count}x"], capture_output=True,
            text=True, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr
        text = log.read_text()
        forks[count] = sum(1 for line in text.splitlines()
                           if ("clone(" in line or "clone3(" in line
                               or "fork(" in line)
                           and "CLONE_THREAD" not in line
                           and "= -1" not in line)
    assert forks[3] == forks[300], forks
