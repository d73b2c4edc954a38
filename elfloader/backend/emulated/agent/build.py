"""Build the qemu engine's guest agents.

    python -m elfloader.backend.emulated.agent.build [--out-dir DIR]

Compiles ``agent.c`` for each architecture the runtime runs as a static
Linux program (musl libc, with zig's clang and lld from the ``ziglang``
package) and packs the six executables into ``DIR/agent.sos`` (default:
this directory, where the committed bundle lives), a FatELF bundle. The
agents are built for each architecture's oldest CPU model the engine
offers (i686 without SSE2, Cortex-A9, RV32IMA soft-float, RV64GC), so one
agent runs under every CPU profile. With the pinned ziglang release the
bundle is reproduced byte for byte.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fatelf import private_dirs

from ....arch import ARCHES

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "agent.c"
BUNDLE = HERE / "agent.sos"

#: zig target flags per architecture (static Linux programs), in the order
#: of the runtime's architectures: each :attr:`elfloader.arch.Arch.builds`'s
#: ``agent``.
TARGETS: dict[str, tuple[str, ...]] = {a.name: a.builds.agent for a in ARCHES}

CFLAGS = ("-std=c17", "-static", "-O2", "-s", "-Wall", "-Werror", "-g0",
          "-fno-unwind-tables", "-fno-asynchronous-unwind-tables",
          "-Wl,--build-id=none")


def build_one(arch: str, work: Path) -> bytes:
    """The agent executable for ``arch``.

    Raises:
        fatelf.private_dirs.UnsafePathError: zig's cache folder (when
            ``ZIG_GLOBAL_CACHE_DIR`` is not set) is a symlink, someone
            else's or writable by others.
        subprocess.CalledProcessError: the compiler failed.
    """
    out = work / f"agent_{arch}"
    env = dict(os.environ)
    if not env.get("ZIG_GLOBAL_CACHE_DIR"):
        # zig's cache goes into what it builds: the runtime's private cache
        # folder, created 0700 and checked (hal_cpu.buildtools.zig uses the same)
        env["ZIG_GLOBAL_CACHE_DIR"] = str(private_dirs.cache_folder("zig"))
    subprocess.run([sys.executable, "-m", "ziglang", "cc", *TARGETS[arch], *CFLAGS,
                    SOURCE.name, "-o", str(out)], cwd=HERE, env=env, check=True)
    return out.read_bytes()


def build(out_dir: Path | str | None = None) -> Path:
    """Build every agent and write ``agent.sos`` into ``out_dir``; returns
    its path."""
    import fatelf
    out = Path(out_dir) if out_dir else HERE
    with tempfile.TemporaryDirectory(prefix="agent_build_") as tmp:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            done = {a: pool.submit(build_one, a, Path(tmp)) for a in TARGETS}
            singles = {a: f.result() for a, f in done.items()}
    path = out / BUNDLE.name
    path.write_bytes(fatelf.join(list(singles.values()),
                                 names=[f"agent_{a}" for a in singles]))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="where to write agent.sos")
    args = parser.parse_args(argv)
    print(build(args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
