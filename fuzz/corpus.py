"""The seed files and the cases built from them.

Seeds are the repository's own files: the IREE executables
``hal_cpu/samples/*_<arch>.so`` (target ``elf``), the plugins
``sample_plugins/prebuilt/standalone_<arch>.so`` (target ``plugin``) and the
FatELF bundles ``sample_plugins/prebuilt/*.sos`` and
``hal_cpu/runtime/runtime.sos`` (target ``fatelf``). The native backend only
gets seeds of the host architecture; the emulated one gets all six.

A case is a plain dict (JSON-serializable): its index, target, backend,
architecture, seed path, the mutations' descriptions and their byte
operations. :func:`make_case` derives everything from ``(seed, backend,
index)`` alone, so a run is the same whatever the number of jobs.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import elfloader
import fatelf

from . import mutate
from .model import ElfModel, FatModel, struct_sites

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
MANIFEST = SAMPLES / "manifest.json"
PREBUILT = ROOT / "sample_plugins" / "prebuilt"
RUNTIME_BUNDLE = ROOT / "hal_cpu" / "runtime" / "runtime.sos"

TARGETS = ("elf", "fatelf", "plugin", "threads", "files")
#: Targets run only when named (not part of ``--target all``): ``code``,
#: hostile machine code in a valid executable, emulated only; ``vmfb``,
#: compiled modules for the VM module reader (:mod:`fuzz.vmfb`).
EXTRA_TARGETS = ("code", "vmfb", "program", "mlir", "vmfb-run", "names")
#: Targets whose cases are mutated executables (``threads``: dispatched
#: from several threads while another closes it; ``files``: given as a
#: path that is a FIFO, a directory, a device, a huge sparse file...).
EXECUTABLE_TARGETS = ("elf", "threads", "files", "code")
#: What the path of a ``files`` case is.
FILE_KINDS = ("fifo", "directory", "device", "sparse", "plain")
BACKENDS = ("native", "emulated")


@dataclass
class Seed:
    """One seed file.

    Attributes:
        path: relative to the repository; kind: ``executable``, ``plugin``,
        ``plugin-bundle`` or ``runtime-bundle``; arch: the ELF's
        architecture (None for bundles); kernel: manifest entry of an
        executable; model: :class:`ElfModel` or :class:`FatModel`.
    """
    path: str
    kind: str
    data: bytes
    arch: str | None = None
    kernel: str | None = None
    model: object = None
    arches: list = field(default_factory=list)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _warn(msg: str) -> None:
    print(f"fuzz: {msg}", file=sys.stderr)


def _sites(model: ElfModel, kind: str) -> list:
    """Struct sites of a seed; an empty list (and a warning) when the
    seed's query cannot be run here."""
    try:
        return struct_sites(model, kind)
    except Exception as exc:  # the seeds are trusted; this only limits mutations
        _warn(f"no IREE struct sites for {model.name}: {type(exc).__name__}: {exc}")
        return []


class Corpus:
    """All seeds, by target."""

    def __init__(self, with_sites: bool = True):
        self.manifest = load_manifest()
        self.seeds: dict[str, list[Seed]] = {t: [] for t in TARGETS + EXTRA_TARGETS}
        by_file = {}
        for kernel, spec in self.manifest["kernels"].items():
            for arch, info in spec["per_arch"].items():
                by_file[info["file"]] = (kernel, arch)
        for name in sorted(by_file):
            kernel, arch = by_file[name]
            path = SAMPLES / name
            data = path.read_bytes()
            model = ElfModel.build(data, 0, _rel(path))
            if with_sites:
                model.sites = _sites(model, "executable")
            self.seeds["elf"].append(Seed(_rel(path), "executable", data, arch, kernel,
                                          model))
        for arch in fatelf.RUNTIME_ARCHES:
            path = PREBUILT / f"standalone_{arch}.so"
            data = path.read_bytes()
            model = ElfModel.build(data, 0, _rel(path))
            if with_sites:
                model.sites = _sites(model, "plugin")
            self.seeds["plugin"].append(Seed(_rel(path), "plugin", data, arch, None, model))
        self.seeds["threads"] = self.seeds["files"] = self.seeds["elf"]
        self.seeds["code"] = self.seeds["elf"]
        plugin_sites = {s.data: s.model.sites for s in self.seeds["plugin"]}
        bundles = sorted(PREBUILT.glob("*.sos")) + [RUNTIME_BUNDLE]
        for path in bundles:
            data = path.read_bytes()
            kind = "runtime-bundle" if path == RUNTIME_BUNDLE else "plugin-bundle"
            fm = FatModel.build(data, _rel(path))
            if with_sites and kind == "plugin-bundle":
                for pm in fm.payloads:
                    sites = plugin_sites.get(pm.data)
                    pm.sites = _rebase(sites, pm.base) if sites is not None else \
                        _sites(pm, "plugin")
            self.seeds["fatelf"].append(Seed(_rel(path), kind, data, None, None, fm,
                                             list(fm.arches)))

    def vmfb_seeds(self) -> list[Seed]:
        """The ``vmfb`` seeds, compiled (or taken from the compile cache)
        the first time a case needs them."""
        if not self.seeds["vmfb"]:
            from .vmfb import VmfbModel, seed_files
            for name, path in seed_files():
                data = path.read_bytes()
                self.seeds["vmfb"].append(Seed(name, "vmfb", data, name.rsplit("@", 1)[1],
                                               None, VmfbModel.build(data, name)))
        return self.seeds["vmfb"]

    def run_seeds(self) -> list[Seed]:
        """The ``vmfb-run`` and ``names`` seeds (:mod:`fuzz.vmrun`),
        compiled (or taken from the compile cache) the first time a case
        needs them."""
        if not self.seeds["vmfb-run"]:
            from .vmrun import ProgramModel, seed_files
            for name, arch, path in seed_files():
                data = path.read_bytes()
                self.seeds["vmfb-run"].append(Seed(name, "vmfb", data, arch, None,
                                                   ProgramModel.build(data, name)))
            from .vmrun import PluginNames, plugin_seed_files
            plugins = []
            for name, arch, path in plugin_seed_files():
                data = path.read_bytes()
                plugins.append(Seed(name, "plugin", data, arch, None,
                                    PluginNames.build(data, name)))
            # names: the programs', and the sample plugin's (its name,
            # description and import names)
            self.seeds["names"] = self.seeds["vmfb-run"] + plugins
        return self.seeds["vmfb-run"]

    def mlir_seeds(self) -> list[Seed]:
        """The ``mlir`` seeds: program texts (:mod:`fuzz.programs`)."""
        if not self.seeds["mlir"]:
            from .programs import mlir_seed_files
            for name, path in mlir_seed_files():
                self.seeds["mlir"].append(Seed(name, "mlir", path.read_bytes()))
        return self.seeds["mlir"]

    def eligible(self, target: str, backend: str) -> list[Seed]:
        if target == "mlir":
            return self.mlir_seeds()
        if target == "vmfb":
            return self.vmfb_seeds()
        if target in ("vmfb-run", "names"):
            # the host's programs natively, the others' emulated
            host = elfloader.arch.host()
            host_name = host.name if host else None
            self.run_seeds()
            return [s for s in self.seeds[target]
                    if (s.arch == host_name) == (backend == "native")]
        if target == "program":
            if backend == "native":
                # (other architectures' programs cannot run natively)
                host = elfloader.arch.host()
                return [s for s in self.vmfb_seeds() if host and s.arch == host.name]
            return self.vmfb_seeds()
        seeds = self.seeds[target]
        if target == "code":
            # hostile code never runs natively: it would run on this host;
            # and export 0 must be known
            return [] if backend == "native" else [s for s in seeds if any(
                x.name == "library.exports.ptrs[0]" for x in s.model.sites)]
        if backend == "native":
            host = elfloader.arch.host()
            host_name = host.name if host else None
            if target == "fatelf":
                return [s for s in seeds if host_name in s.arches]
            return [s for s in seeds if s.arch == host_name]
        return seeds

    def seed(self, path: str) -> Seed:
        if path.startswith("vmfb:"):
            self.vmfb_seeds()
        if path.startswith("mlir:"):
            self.mlir_seeds()
        if path.startswith(("vmfb-run:", "plugin-names:")):
            self.run_seeds()
        for seeds in self.seeds.values():  # (threads/files share elf's)
            for s in seeds:
                if s.path == path:
                    return s
        raise KeyError(path)


def _rebase(sites, base: int):
    """Struct sites of a standalone seed moved to a payload at ``base``."""
    out = []
    for s in sites:
        f = s.field
        out.append(type(s)(s.name, s.vaddr, s.kind,
                           type(f)(f.name, f.offset + base, f.size, f.value, f.kind), s.via))
    return out


def case_rng(seed: int, backend: str, index: int) -> random.Random:
    return random.Random(f"pkr-fuzz:{seed}:{backend}:{index}")


def make_case(corpus: Corpus, seed: int, backend: str, index: int,
              targets: tuple[str, ...], env=None, kill_host: float = 0.0) -> dict:
    """Case ``index`` of ``backend`` for run ``seed`` (deterministic).
    ``env`` (target ``code``): a function of the index giving the canary
    values the planted code aims at (:meth:`fuzz.code.Canary.env`);
    without it, placeholders. ``kill_host`` (target ``code``): the
    fraction of cases whose child kills itself mid-run (after a delay of
    0.05 to 1 s drawn per case, ``kill_host_after``)."""
    rng = case_rng(seed, backend, index)
    target = targets[index % len(targets)]
    eligible = corpus.eligible(target, backend)
    if not eligible:
        raise SystemExit(f"fuzz: no {target} seed for the {backend} backend")
    s = rng.choice(eligible)
    extra = {}
    if target == "fatelf":
        host = elfloader.arch.host()
        arch = host.name if backend == "native" else rng.choice(s.arches)
        muts = mutate.mutate_fatelf(rng, s.model)
    elif target == "code":
        from . import code
        arch = s.arch
        extra["plan"] = code.plan(rng)
        extra["canary"] = env(index) if env is not None else code.placeholder_env(index)
        extra["region"] = list(code.export_range(s.model))
        muts = code.materialize(extra["plan"], arch, tuple(extra["region"]), extra["canary"])
        if kill_host:
            k = random.Random(f"pkr-fuzz-kill:{seed}:{backend}:{index}")
            if k.random() < kill_host:
                extra["kill_host_after"] = round(k.uniform(0.05, 1.0), 3)
    elif target == "vmfb":
        from .vmfb import mutate_vmfb
        arch = s.arch
        muts = mutate_vmfb(rng, s.model)
    elif target == "program":
        from .programs import mutate_program
        arch = s.arch
        muts, extra["host_mode"] = mutate_program(rng, s)
    elif target == "names" and s.kind == "plugin":
        from .vmrun import mutate_plugin_names
        arch = s.arch
        muts = mutate_plugin_names(rng, s.model)
    elif target in ("vmfb-run", "names"):
        from .vmrun import mutate_run
        arch = s.arch
        muts = mutate_run(rng, s.model, names=target == "names")
    elif target == "mlir":
        from .programs import mutate_mlir
        host = elfloader.arch.host()
        arch = (host.name if backend == "native" and host is not None
                else rng.choice(["aarch64", "riscv64", "riscv32"]))
        muts = mutate_mlir(rng, s.data)
        extra["host_mode"] = (rng.choice(["ok", "ok", "raise", "wrong"])
                              if "host_modules" in s.path else "ok")
    else:
        arch = s.arch
        muts = mutate.mutate_elf(rng, s.model)
    ops = [op for _, m_ops in muts for op in m_ops]
    if target == "files":
        extra["file_kind"] = rng.choice(FILE_KINDS)
    if target == "threads":
        extra["close_after"] = round(rng.uniform(0.0, 0.05), 4)
    return {**extra,
        "id": f"{target}-{backend}-{index:06d}",
        "index": index, "target": target, "backend": backend, "arch": arch,
        "seed": s.path, "kind": s.kind, "kernel": s.kernel,
        "mutations": [d for d, _ in muts],
        "groups": [len(m_ops) for _, m_ops in muts],
        "ops": mutate.ops_to_json(ops),
    }


def case_data(corpus: Corpus, case: dict) -> bytes:
    return mutate.apply(corpus.seed(case["seed"]).data, mutate.ops_from_json(case["ops"]))


def dispatch_spec(manifest: dict, kernel: str, arch: str) -> dict:
    """Bindings (byte lengths), workgroup count and constants of a sample's
    first export, from ``hal_cpu/samples/manifest.json``."""
    spec = manifest["kernels"][kernel]
    per = spec["per_arch"][arch]
    return {"bindings": [b["length"] for b in spec["bindings"]],
            "roles": [b["role"] for b in spec["bindings"]],
            "workgroup_count": per["workgroup_count"], "constants": per["constants"]}


def replan(corpus: Corpus, case: dict, env: dict) -> dict:
    """A ``code`` case planned again against canaries ``env`` (a replay
    has new ones: another directory, port and process)."""
    from . import code
    s = corpus.seed(case["seed"])
    region = tuple(case.get("region") or code.export_range(s.model))
    muts = code.materialize(case["plan"], case["arch"], region, env)
    return dict(case, canary=env, mutations=[d for d, _ in muts],
                groups=[len(m_ops) for _, m_ops in muts],
                ops=mutate.ops_to_json([op for _, m_ops in muts for op in m_ops]))
