"""Nothing the runtime runs or writes comes from a folder another local user
controls.

Each finding is reproduced as it was made (a launcher planted in the
shared-temp fallback folder under the digest the compiler computes, zig's
cache name in the temporary folder planted as a symlink, a symlink at
``fatelf split``'s output path), with the real commands (``hal-cpu plan``,
``hal-cpu build-plugin``, ``fatelf``) and ``TMPDIR``, ``HOME`` and
``XDG_CACHE_HOME`` pointed into the test's folder. "Another user" is uid
65534 (the tests run as root) or a folder anyone may write (mode 0777).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fatelf
from fatelf import private_dirs
from fatelf.private_dirs import UnsafePathError

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
SUM_LAST = SAMPLES / "samples_sum_last.mlir"
PLUGIN_SOURCE = ROOT / "sample_plugins" / "standalone_plugin.c"
OTHER_UID = 65534

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


def _env(tmp_path: Path, *, home: Path | None = None, cache: Path | None = None) -> dict:
    """The environment of a command: a temporary folder, home and cache
    home of the test's own, and no cache location inherited."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ZIG_GLOBAL_CACHE_DIR", "PKR_COMPILE_CACHE", "XDG_CACHE_HOME")}
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)       # a shared temporary folder, as /tmp is
    env["TMPDIR"] = str(tmp)
    env["HOME"] = str(home if home is not None else tmp_path / "home")
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return env


def _run(argv: list, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *map(str, argv)], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def _chown_tree(path: Path, uid: int) -> None:
    for folder, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(folder, name), uid, uid)
    os.lchown(path, uid, uid)


# ----------------------------------------------------------------------------
# the 32-bit linker launcher

def _launcher_digest(arch: str = "x86_32") -> str:
    """The digest naming the launcher folder, computed as
    hal_cpu.programs.compiler.libm_linker_flags does (what an attacker can do)."""
    from fatelf import arches
    from hal_cpu import runtime
    from hal_cpu.programs import compiler

    lld = compiler._iree_lld()
    if lld is None:
        pytest.skip("iree-lld not installed")
    obj = fatelf.select(runtime.LIBM_BUNDLE.read_bytes(), arch)
    profile = arches.profile(arch, arches.DEFAULT_PROFILES[arch])
    redirects = [f"--redirect={name}={target}" for name, target in sorted(
        runtime.LIBM_REDIRECTS.get((arch, profile.name), {}).items())]
    return hashlib.sha256(b"\0".join([
        obj, runtime.LIBM_LINKER.read_bytes(), str(runtime.LIBM_LINKER).encode(),
        sys.executable.encode(), str(lld).encode(),
        *(r.encode() for r in redirects)])).hexdigest()[:16]


def _plant_launcher(folder: Path, marker: Path) -> Path:
    """A launcher at ``folder/iree-lld`` that leaves ``marker`` when run."""
    folder.mkdir(parents=True)
    launcher = folder / "iree-lld"
    launcher.write_text(f"#!/bin/sh\necho planted > {marker}\nexit 1\n")
    launcher.chmod(0o755)
    (folder / "libm.o").write_bytes(b"planted")
    return launcher


def _plan(tmp_path: Path, env: dict, cache_dir: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("iree.compiler")
    return _run(["hal_cpu", "plan", SUM_LAST, "--arch=x86_32",
                 "--input=9x129xf32=1", f"--cache_dir={cache_dir}"], env, tmp_path)


def test_planted_launcher_in_the_old_fallback_folder_is_not_run(tmp_path):
    # the finding: a home with a space sends the launcher to the shared
    # temporary folder, where $TMPDIR/hal_cpu-<uid>/.libm-link-x86_32-<digest>
    # /iree-lld, planted by another user, was reused and run
    home = tmp_path / "my home"
    env = _env(tmp_path, home=home)
    digest = _launcher_digest()
    marker = tmp_path / "planted-ran"
    old = Path(env["TMPDIR"]) / f"hal_cpu-{os.getuid()}"
    _plant_launcher(old / f".libm-link-x86_32-{digest}", marker)
    old.chmod(0o777)
    proc = _plan(tmp_path, env, tmp_path / "out dir")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    # the launcher the compile used: written fresh under the private
    # per-user root, named by the same digest
    root = Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}"
    made = root / "iree-compile" / f".libm-link-x86_32-{digest}"
    assert (made / "iree-lld").is_file()
    for folder in (root, root / "iree-compile", made):
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
        assert stat.S_IMODE(st.st_mode) == 0o700, folder


def _plant_root(kind: str, root: Path, marker: Path, digest: str) -> None:
    """The per-user root in the temporary folder, planted by another user
    with a launcher under the digest."""
    real = root.parent / "elsewhere" if kind == "symlink" else root
    _plant_launcher(real / "iree-compile" / f".libm-link-x86_32-{digest}", marker)
    if kind == "other owner":
        for folder in (real, real / "iree-compile"):
            folder.chmod(0o700)
        _chown_tree(real, OTHER_UID)
    elif kind == "world-writable":
        real.chmod(0o777)
    else:
        _chown_tree(real, OTHER_UID)
        root.symlink_to(real)


@pytest.mark.parametrize("kind, field", [
    pytest.param("other owner", "cache_dir.owner", marks=needs_root),
    ("world-writable", "cache_dir.mode"),
    pytest.param("symlink", "cache_dir.symlink", marks=needs_root),
])
def test_planted_per_user_root_in_temp_is_refused(tmp_path, kind, field):
    env = _env(tmp_path, home=tmp_path / "my home")
    digest = _launcher_digest()
    marker = tmp_path / "planted-ran"
    root = Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}"
    _plant_root(kind, root, marker, digest)
    proc = _plan(tmp_path, env, tmp_path / "out dir")
    assert proc.returncode == 1, proc.stderr
    assert not marker.exists()
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line
    assert f"{root}: {field}:" in line, line


@pytest.mark.parametrize("change, field", [
    ("launcher rewritten", "linker iree-lld.content"),
    ("folder opened to all", "linker folder.mode"),
    pytest.param("launcher of another user", "linker iree-lld.owner", marks=needs_root),
])
def test_changed_launcher_in_own_root_is_refused(tmp_path, change, field):
    env = _env(tmp_path, home=tmp_path / "my home")
    proc = _plan(tmp_path, env, tmp_path / "out dir")
    assert proc.returncode == 0, proc.stderr
    folder = (Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}"
              / "iree-compile" / f".libm-link-x86_32-{_launcher_digest()}")
    launcher = folder / "iree-lld"
    marker = tmp_path / "planted-ran"
    if change == "launcher rewritten":
        launcher.write_text(f"#!/bin/sh\necho planted > {marker}\nexit 1\n")
    elif change == "folder opened to all":
        folder.chmod(0o777)
    else:
        os.lchown(launcher, OTHER_UID, OTHER_UID)
    # a new program, so that the compile runs (and would run the launcher)
    program = tmp_path / "again.mlir"
    program.write_text(SUM_LAST.read_text())
    proc = _run(["hal_cpu", "plan", program, "--arch=x86_32", "--input=9x129xf32=1",
                 f"--cache_dir={tmp_path / 'out dir'}"], env, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert not marker.exists()
    assert f": {field}:" in proc.stderr and "Traceback" not in proc.stderr


def test_cache_dir_with_a_space_uses_the_user_cache_home(tmp_path):
    # the cache home is shell-safe: the launcher goes there, never to the
    # temporary folder
    cache = tmp_path / "xdg"
    env = _env(tmp_path, cache=cache)
    digest = _launcher_digest()
    marker = tmp_path / "planted-ran"
    _plant_launcher(Path(env["TMPDIR"]) / f"hal_cpu-{os.getuid()}"
                    / f".libm-link-x86_32-{digest}", marker)
    proc = _plan(tmp_path, env, tmp_path / "out dir")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    root = cache / private_dirs.APP
    assert (root / "iree-compile" / f".libm-link-x86_32-{digest}" / "iree-lld").is_file()
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(root / "iree-compile").st_mode) == 0o700
    assert not (Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}").exists()


def test_compile_program_refuses_an_out_dir_others_can_write(tmp_path):
    pytest.importorskip("iree.compiler")
    from hal_cpu.programs import IreeToolError, compile_program
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(IreeToolError) as info:
        compile_program(SUM_LAST, "x86_64", out)
    assert (info.value.name, info.value.field, info.value.value) == (
        str(out), "cache_dir.mode", "0o777")


# ----------------------------------------------------------------------------
# zig's cache

def _other_users_folder(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o777)     # another user's folder we could write into as root
    if os.getuid() == 0:
        os.chown(victim, OTHER_UID, OTHER_UID)
    return victim


def test_symlinked_zig_cache_in_temp_is_not_written(tmp_path):
    # the finding: $TMPDIR/portable_kernel_runtime_zig_cache planted as a
    # symlink to another user's folder received build-plugin's zig cache
    pytest.importorskip("ziglang")
    cache = tmp_path / "xdg"
    env = _env(tmp_path, cache=cache)
    victim = _other_users_folder(tmp_path)
    (Path(env["TMPDIR"]) / "portable_kernel_runtime_zig_cache").symlink_to(victim)
    out = tmp_path / "plugin.so"
    proc = _run(["hal_cpu", "build-plugin", PLUGIN_SOURCE, "--arch=x86_64", "-o", out],
                env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    assert list(victim.iterdir()) == []
    zig = cache / private_dirs.APP / "zig"
    assert any(zig.iterdir())
    for folder in (zig.parent, zig):
        st = os.lstat(folder)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def _no_cache_home(tmp_path: Path) -> Path:
    """An XDG_CACHE_HOME that cannot be created (under a regular file)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    return blocker / "cache"


@pytest.mark.parametrize("kind, field", [
    ("symlink", "cache.symlink"),
    ("world-writable", "cache.mode"),
    pytest.param("other owner", "cache.owner", marks=needs_root),
])
def test_build_plugin_refuses_a_planted_temp_fallback(tmp_path, kind, field):
    pytest.importorskip("ziglang")
    env = _env(tmp_path, cache=_no_cache_home(tmp_path))
    victim = _other_users_folder(tmp_path)
    root = Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}"
    if kind == "symlink":
        root.symlink_to(victim)
    else:
        root.mkdir(mode=0o700)
        if kind == "world-writable":
            root.chmod(0o777)
        else:
            os.chown(root, OTHER_UID, OTHER_UID)
    out = tmp_path / "plugin.so"
    proc = _run(["hal_cpu", "build-plugin", PLUGIN_SOURCE, "--arch=x86_64", "-o", out],
                env, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"{root}: {field}:" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
    assert list(victim.iterdir()) == []


def test_zig_cache_falls_back_to_a_private_temp_folder(tmp_path, monkeypatch):
    from hal_cpu.buildtools import zig as zigbuild
    env = _env(tmp_path, cache=_no_cache_home(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    monkeypatch.setattr(tempfile, "tempdir", env["TMPDIR"])
    folder = zigbuild.cache_dir()
    assert folder == Path(env["TMPDIR"]) / f"portable-kernel-runtime-{os.getuid()}" / "zig"
    assert stat.S_IMODE(os.lstat(folder.parent).st_mode) == 0o700
    # then planted: refused with hal_cpu's error type
    folder.parent.chmod(0o757)
    with pytest.raises(zigbuild.ZigBuildError) as info:
        zigbuild.cache_dir()
    assert (info.value.name, info.value.field) == (str(folder.parent), "cache.mode")


def test_agent_build_refuses_a_symlinked_zig_cache(tmp_path, monkeypatch):
    from elfloader.backend.emulated.agent import build
    env = _env(tmp_path, cache=tmp_path / "xdg")
    victim = _other_users_folder(tmp_path)
    root = tmp_path / "xdg" / private_dirs.APP
    root.parent.mkdir()
    root.symlink_to(victim)
    monkeypatch.delenv("ZIG_GLOBAL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    with pytest.raises(UnsafePathError) as info:
        build.build_one("x86_64", tmp_path)
    assert (info.value.name, info.value.field) == (str(root), "cache.symlink")
    assert list(victim.iterdir()) == []


def test_private_dir_narrows_a_readable_folder_of_ours(tmp_path):
    folder = tmp_path / "ours"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    assert private_dirs.private_dir(folder) == folder
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


# ----------------------------------------------------------------------------
# fatelf writers

def _fatelf(args: list, tmp_path: Path) -> subprocess.CompletedProcess:
    return _run(["fatelf.cli", *args], _env(tmp_path), tmp_path)


@pytest.fixture
def bundle(tmp_path) -> Path:
    path = tmp_path / "b.sos"
    path.write_bytes((SAMPLES / "standalone.sos").read_bytes())
    return path


@pytest.fixture
def victim_file(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("another user's file\n")
    return path


def test_split_refuses_a_symlink_at_an_output_path(tmp_path, bundle, victim_file):
    # the finding: `fatelf split b.sos` wrote through b_x86_64.so -> victim
    link = tmp_path / "b_x86_64.so"
    link.symlink_to(victim_file)
    proc = _fatelf(["split", bundle], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == (f"fatelf: {link}: output: the output path is a symlink "
                           f"(to '{victim_file}'); refusing to write through it or "
                           f"replace it: remove it or choose another path\n")
    assert victim_file.read_text() == "another user's file\n"
    assert os.path.islink(link)
    # every path is checked before the first is written
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "b.sos", "b_x86_64.so", "tmp", "victim.txt"]


def test_split_replaces_regular_files(tmp_path, bundle):
    old = tmp_path / "b_x86_64.so"
    old.write_bytes(b"old")
    old.chmod(0o640)
    proc = _fatelf(["split", bundle], tmp_path)
    assert proc.returncode == 0, proc.stderr
    fat = fatelf.FatElf.parse(bundle.read_bytes(), str(bundle))
    assert old.read_bytes() == fat.select("x86_64")
    assert stat.S_IMODE(old.stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if "fatelf-tmp" in p.name]


@pytest.mark.parametrize("command", [
    ["extract", "--arch=x86_64", "-o"],
    ["select", "--arch=x86_64", "-o"],
    ["remove", "--arch=x86_64", "-o"],
])
def test_writers_refuse_a_symlink_output(tmp_path, bundle, victim_file, command):
    link = tmp_path / "out"
    link.symlink_to(victim_file)
    proc = _fatelf([command[0], bundle, *command[1:], link], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"fatelf: {link}: output: the output path is a symlink")
    assert victim_file.read_text() == "another user's file\n"


def test_in_place_rewrite_refuses_a_symlinked_bundle(tmp_path, bundle):
    link = tmp_path / "link.sos"
    link.symlink_to(bundle)
    before = bundle.read_bytes()
    proc = _fatelf(["remove", link, "--arch=x86_64"], tmp_path)
    assert proc.returncode == 1
    assert f"fatelf: {link}: output: the output path is a symlink" in proc.stderr
    assert bundle.read_bytes() == before and os.path.islink(link)


def test_extract_writes_a_new_file_and_to_dev_null(tmp_path, bundle):
    out = tmp_path / "x.so"
    assert _fatelf(["extract", bundle, "--arch=x86_64", "-o", out], tmp_path).returncode == 0
    fat = fatelf.FatElf.parse(bundle.read_bytes(), str(bundle))
    assert out.read_bytes() == fat.select("x86_64")
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    proc = _fatelf(["extract", bundle, "--arch=x86_64", "-o", os.devnull], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o705, 0o770, 0o702, 0o600, 0o644, 0o620])
def test_is_private_says_what_the_checks_accept(tmp_path, mode):
    """private_dirs.is_private on an lstat result answers as
    check_private_dir (not narrowing) and check_private_file do."""
    from fatelf import private_dirs

    folder, file = tmp_path / "d", tmp_path / "f"
    folder.mkdir()
    file.write_bytes(b"x")
    link = tmp_path / "l"
    link.symlink_to(file)
    for path, directory, check in ((folder, True, private_dirs.check_private_dir),
                                   (file, False, private_dirs.check_private_file),
                                   (link, False, private_dirs.check_private_file),
                                   (file, True, private_dirs.check_private_dir)):
        if not path.is_symlink():
            os.chmod(path, mode)
        try:
            check(path)
            accepted = True
        except private_dirs.UnsafePathError:
            accepted = False
        assert private_dirs.is_private(os.lstat(path), directory=directory) is accepted, \
            (path.name, oct(mode))
