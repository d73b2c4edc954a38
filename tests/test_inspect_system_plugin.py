"""``hal-cpu inspect`` of a system library plugin (linked against libc)
whose constructor and query try to reach the host: by default nothing of it
runs (its file is read); --run_sandboxed runs its query in a confined child
that refuses what it tries; --run_native runs it with the user's rights."""

from __future__ import annotations

import os
import pickle
import platform
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from elfloader.backend.emulated import sandbox
from hal_cpu import isolate

ROOT = Path(__file__).resolve().parent.parent

SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plugin_abi.h"

/* Runs when the platform's loader loads the library. */
__attribute__((constructor)) static void make_marker(void) {
  const char* dir = getenv("INSPECT_MARKER_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/constructor-ran", dir ? dir : "/tmp");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!write(fd, "x", 1);
    close(fd);
  }
}

static char description[256];

static iree_hal_executable_plugin_status_t evil_load(
    const iree_hal_executable_plugin_environment_v0_t* environment,
    size_t param_count, const iree_hal_executable_plugin_string_pair_t* params,
    void** out_self) {
  (void)environment; (void)param_count; (void)params;
  *out_self = NULL;
  return NULL;
}

static void evil_unload(void* self) { (void)self; }

static iree_hal_executable_plugin_status_t evil_resolve(
    void* self, const iree_hal_executable_plugin_resolve_params_v0_t* params,
    iree_hal_executable_plugin_resolution_t* out_resolution) {
  (void)self; (void)params;
  *out_resolution = 0;
  return NULL;
}

static iree_hal_executable_plugin_header_t header = {
    .version = IREE_HAL_EXECUTABLE_PLUGIN_VERSION_0_1,
    .name = "evil",
    .description = description,
};

static const iree_hal_executable_plugin_v0_t plugin = {
    .header = &header, .load = evil_load, .unload = evil_unload,
    .resolve = evil_resolve};

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT const iree_hal_executable_plugin_header_t**
iree_hal_executable_plugin_query(iree_hal_executable_plugin_version_t max_version,
                                 void* reserved) {
  (void)max_version; (void)reserved;
  const char* dir = getenv("INSPECT_MARKER_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/query-ran", dir ? dir : "/tmp");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const char* create = fd >= 0 ? "done" : "refused";
  if (fd >= 0) close(fd);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  const char* sock = s >= 0 ? "done" : "refused";
  if (s >= 0) close(s);
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  if (pid > 0) waitpid(pid, NULL, 0);
  const char* proc = pid >= 0 ? "done" : "refused";
  snprintf(description, sizeof description, "create=%s socket=%s fork=%s",
           create, sock, proc);
  return (const iree_hal_executable_plugin_header_t**)&plugin;
}

IREE_HAL_EXECUTABLE_PLUGIN_EXPORT int other_function(int x) { return x + 1; }
"""


def _compiler() -> list[str]:
    for cc in ("gcc", "cc"):
        if shutil.which(cc):
            return [cc]
    pytest.importorskip("ziglang")
    target = {"x86_64": "x86_64", "aarch64": "aarch64",
              "arm64": "aarch64"}.get(platform.machine())
    if target is None:
        pytest.skip(f"no C compiler for {platform.machine()}")
    return [sys.executable, "-m", "ziglang", "cc", "-target",
            f"{target}-linux-gnu"]


@pytest.fixture(scope="module")
def evil(tmp_path_factory) -> Path:
    """evil.so: a shared library linked against libc whose constructor
    creates ``constructor-ran`` and whose query creates ``query-ran``, opens
    a socket and forks, in $INSPECT_MARKER_DIR."""
    work = tmp_path_factory.mktemp("evil")
    (work / "evil.c").write_text(SOURCE)
    out = work / "evil.so"
    subprocess.run([*_compiler(), "-shared", "-fPIC", "-O1",
                    "-I", str(ROOT / "hal_cpu" / "include"),
                    "-o", str(out), str(work / "evil.c")],
                   check=True, capture_output=True)
    return out


def inspect(*args, markers: Path):
    env = dict(os.environ, INSPECT_MARKER_DIR=str(markers))
    return subprocess.run([sys.executable, "-m", "hal_cpu", "inspect",
                           *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env)


def test_inspect_reads_a_system_library_without_running_it(evil, tmp_path):
    proc = inspect(evil, markers=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "constructor-ran").exists()
    assert not (tmp_path / "query-ran").exists()
    out = proc.stdout
    assert "kind:         system library" in out
    assert "iree_hal_executable_plugin_query  (func)" in out
    assert "other_function  (func)" in out
    assert "libc.so.6" in out
    assert f"architecture: {platform.machine()}" in out.replace(
        "arm64", "aarch64")
    assert "query:        not run: nothing of the file ran" in out


def test_inspect_with_a_system_plugin_runs_nothing_of_it(evil, tmp_path):
    """A system library given as a plugin of an executable is not loaded
    either."""
    proc = inspect(ROOT / "hal_cpu" / "samples" / "sum_last_x86_64.so",
                   "--arch=x86_64", f"--executable_plugin={evil}",
                   markers=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "constructor-ran").exists()


@pytest.mark.skipif(not sandbox.status()["seccomp"],
                    reason="no seccomp filter on this machine")
def test_run_sandboxed_refuses_what_the_library_tries(evil, tmp_path):
    proc = inspect(evil, "--run_sandboxed", markers=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "constructor-ran").exists()
    assert not (tmp_path / "query-ran").exists()
    out = proc.stdout
    assert "other_function  (func)" in out
    assert ("ran the plugin's query natively in a confined child process "
            "(--run_sandboxed)") in out
    assert "plugin:       evil (version 0x1)" in out
    assert "create=refused socket=refused fork=refused" in out


def test_run_native_runs_it_with_the_users_rights(evil, tmp_path):
    """--run_native means what it says: the constructor and the query run
    unconfined, so the files are made."""
    proc = inspect(evil, "--run-native", markers=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "constructor-ran").exists()
    assert "ran the plugin's query natively (--run_native)" in proc.stdout
    assert "create=done socket=done fork=done" in proc.stdout


def test_run_sandboxed_and_run_native_exclude_each_other(evil, tmp_path):
    proc = inspect(evil, "--run_sandboxed", "--run_native", markers=tmp_path)
    assert proc.returncode == 2


class _Opens:
    """Pickles as a call that would create a file when unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_confined_child_sends_plain_data_only(tmp_path):
    """What a confined child writes to its pipe is read as plain data:
    a pickle that would run code in the parent is dropped."""
    target = str(tmp_path / "made-by-unpickling")

    def confine(fd: int) -> None:
        data = pickle.dumps(("result", _Opens(target)))
        os.write(fd, struct.pack("<Q", len(data)) + data)

    assert isolate.run_in_child(lambda note: "plain", confine=confine,
                                timeout=30) == "plain"
    assert not os.path.exists(target)
