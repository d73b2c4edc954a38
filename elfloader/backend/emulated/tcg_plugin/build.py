"""Build the qemu engine's TCG plugin (the workbench's instruction counts
and kernel sanitizer).

    python -m elfloader.backend.emulated.tcg_plugin.build [--out-dir DIR]

Compiles ``workbench.c`` as a shared object for each host the engine runs
on (x86_64 and aarch64 Linux, glibc 2.17 and later, with zig's clang from
the ``ziglang`` package) and packs them into ``DIR/tcg_plugin.sos``
(default: this directory, where the committed bundle lives), a FatELF
bundle. The plugin runs inside qemu-user on the host, not in the guest;
qemu-user loads it from a descriptor (``-plugin /proc/self/fd/N``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fatelf import private_dirs

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "workbench.c"
BUNDLE = HERE / "tcg_plugin.sos"

#: zig targets per host architecture the qemu engine runs on.
TARGETS: dict[str, tuple[str, ...]] = {
    "x86_64": ("-target", "x86_64-linux-gnu.2.17"),
    "aarch64": ("-target", "aarch64-linux-gnu.2.17"),
}

CFLAGS = ("-std=c17", "-shared", "-fPIC", "-O2", "-s", "-Wall", "-Werror",
          "-g0", "-fvisibility=hidden", "-Wl,--build-id=none",
          "-Wl,--allow-shlib-undefined")


def build_one(arch: str, work: Path) -> bytes:
    """The plugin shared object for host ``arch``.

    Raises:
        subprocess.CalledProcessError: the compiler failed.
    """
    out = work / f"tcg_plugin_{arch}.so"
    env = dict(os.environ)
    if not env.get("ZIG_GLOBAL_CACHE_DIR"):
        env["ZIG_GLOBAL_CACHE_DIR"] = str(private_dirs.cache_folder("zig"))
    subprocess.run([sys.executable, "-m", "ziglang", "cc", *TARGETS[arch],
                    *CFLAGS, SOURCE.name, "-o", str(out)], cwd=HERE, env=env,
                   check=True)
    return out.read_bytes()


def build(out_dir: Path | str | None = None) -> Path:
    """Build the plugin for every host and write ``tcg_plugin.sos`` into
    ``out_dir``; returns its path."""
    import fatelf
    out = Path(out_dir) if out_dir else HERE
    with tempfile.TemporaryDirectory(prefix="tcg_plugin_build_") as tmp:
        singles = {a: build_one(a, Path(tmp)) for a in TARGETS}
    path = out / BUNDLE.name
    path.write_bytes(fatelf.join(list(singles.values()),
                                 names=[f"tcg_plugin_{a}" for a in singles]))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to write tcg_plugin.sos")
    args = parser.parse_args(argv)
    print(build(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
