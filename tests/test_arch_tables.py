"""Every runtime architecture has a row in each per-architecture table (the
places ARCHITECTURE.md's "a new architecture" list names that are data)."""

import importlib.util
from pathlib import Path

import pytest

from elfloader.arch import by_name
from elfloader.backend.emulated import choice, unicorn_arch
from fatelf import arches
from hal_cpu.runtime import LIBM_ARCHES

ROOT = Path(__file__).resolve().parent.parent


def _load(relative: str):
    """A build script of the project, imported from its file."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_tables", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tables() -> dict[str, object]:
    """Table name -> a mapping with a key per runtime architecture."""
    return {
        "fatelf.arches.DEFAULT_PROFILES": arches.DEFAULT_PROFILES,
        "fatelf.arches.PROFILES": {p.arch: p for p in arches.PROFILES},
        "elfloader.backend.emulated.choice.QEMU": choice.QEMU,
        "elfloader.backend.emulated.unicorn_arch.MODELS": unicorn_arch.MODELS,
        "elfloader/backend/emulated/agent/build.py TARGETS":
            _load("elfloader/backend/emulated/agent/build.py").TARGETS,
        "sample_plugins/build.py VECTOR_PROFILES":
            _load("sample_plugins/build.py").VECTOR_PROFILES,
    }


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_every_table_has_a_row(arch: str) -> None:
    missing = [name for name, table in _tables().items()
               if arch not in table]  # type: ignore[operator]
    assert not missing, f"{arch} has no row in {', '.join(missing)}"


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_psabi_module_has_disassembly_facts(arch: str) -> None:
    facts = by_name(arch).disassembly
    # Either the host's signal context tells a fault's direction (x86) or
    # the facts name the instructions that store.
    assert facts.stores is None or facts.stores
    assert choice.QEMU[arch].program


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_qemu_vector_lengths_come_from_a_profile(arch: str) -> None:
    facts = choice.QEMU[arch]
    if facts.vector_profile is None:
        assert facts.vlens == ()
    else:
        profile = arches.profile(*facts.vector_profile)
        assert facts.vlens == profile.vlens and facts.vlens
        assert "{vlen" in facts.max_model or "{vq}" in facts.max_model


def test_libm_rows_name_runtime_architectures() -> None:
    # Only architectures whose executables link libm's objects have a row.
    assert set(LIBM_ARCHES) <= set(arches.RUNTIME_ARCHES)
