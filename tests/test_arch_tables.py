"""An architecture's facts live in two places: its identity row and CPU
profiles in ``fatelf/arches.py`` (the lowest package, which names
architectures for everyone), and everything else in its module of
``elfloader/arch/`` (one :class:`elfloader.arch.Arch` record). Every other
per-architecture table is derived from those records; these tests check
that each derived table has a row per runtime architecture and holds
exactly what the records say, and that the names the records give
(profiles, unicorn's constants, unicorn setups) exist."""

import importlib.util
from pathlib import Path

import pytest

from elfloader.arch import ARCHES, by_name
from elfloader.backend.emulated import choice, qemu_engine, unicorn_arch
from elfloader.backend.emulated.agent import build as agent_build
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


def _derived() -> dict[str, tuple[dict, object]]:
    """Derived table name -> (the table, what each row must be, as a
    function of the architecture's :class:`Arch`)."""
    return {
        "fatelf.arches.DEFAULT_PROFILES":
            (arches.DEFAULT_PROFILES, lambda a: a.info.default_profile),
        "elfloader.backend.emulated.choice.QEMU": (choice.QEMU, lambda a: a.qemu),
        "elfloader.backend.emulated.choice.QEMU_PROGRAMS":
            (choice.QEMU_PROGRAMS, lambda a: a.qemu.program),
        "elfloader.backend.emulated.qemu_engine.ARENAS":
            (qemu_engine.ARENAS, lambda a: a.qemu.arena),
        "elfloader.backend.emulated.unicorn_arch.MODELS":
            (unicorn_arch.MODELS, lambda a: unicorn_arch.uc_model(a.unicorn)),
        "elfloader/backend/emulated/agent/build.py TARGETS":
            (agent_build.TARGETS, lambda a: a.builds.agent),
        "sample_plugins/build.py VECTOR_PROFILES":
            (_load("sample_plugins/build.py").VECTOR_PROFILES,
             lambda a: a.builds.vector_profile),
    }


def test_records_are_the_runtime_architectures() -> None:
    assert [a.name for a in ARCHES] == list(arches.RUNTIME_ARCHES)


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_derived_tables_hold_the_records(arch: str) -> None:
    record = by_name(arch)
    missing = [name for name, (table, _) in _derived().items() if arch not in table]
    assert not missing, f"{arch} has no row in {', '.join(missing)}"
    wrong = [name for name, (table, row) in _derived().items()
             if table[arch] != row(record)]  # type: ignore[operator]
    assert not wrong, f"{arch}'s row differs from its Arch record in {', '.join(wrong)}"


def test_derived_tables_name_only_runtime_architectures() -> None:
    for name, (table, _) in _derived().items():
        assert set(table) == set(arches.RUNTIME_ARCHES), name
    # The agent bundle's records and the libm objects follow table order.
    assert list(agent_build.TARGETS) == list(arches.RUNTIME_ARCHES)
    assert list(LIBM_ARCHES) == [a.name for a in ARCHES if a.builds.libm]


def test_libm_rows_are_the_records_that_build_it() -> None:
    # Only architectures whose executables link libm's objects have a row.
    assert set(LIBM_ARCHES) <= set(arches.RUNTIME_ARCHES)
    assert LIBM_ARCHES == {a.name: a.builds.libm for a in ARCHES if a.builds.libm}
    assert set(LIBM_ARCHES) == {"x86_32", "arm32", "riscv32"}


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_profiles_the_records_name_exist(arch: str) -> None:
    record = by_name(arch)
    assert arches.profiles(arch), f"{arch} has no row in fatelf.arches.PROFILES"
    arches.profile(arch, record.info.default_profile)
    arches.profile(arch, record.builds.vector_profile)
    if record.qemu.vector_profile is not None:
        arches.profile(*record.qemu.vector_profile)


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_unicorn_names_resolve(arch: str) -> None:
    facts = by_name(arch).unicorn
    assert facts.init is None or facts.init in unicorn_arch.INITS
    model = unicorn_arch.uc_model(facts)
    assert model.syscalls.insns or model.syscalls.intnos
    registers = unicorn_arch.registers(by_name(arch))
    assert len(registers.args) == len(by_name(arch).cc.int_args)


def test_narrow_pairs_are_families() -> None:
    # A 32-bit interpreter on a 64-bit host runs the family's 32-bit member.
    for info in arches.TABLE:
        if info.narrow:
            narrow = arches.lookup(info.narrow)
            assert info.elf_class == 64 and narrow.elf_class == 32, info.name
    assert {a.name: a.narrow for a in arches.TABLE if a.narrow} == {
        "x86_64": "x86_32", "aarch64": "arm32", "riscv64": "riscv32",
        "ppc64": "ppc32", "mips64": "mips32"}


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


@pytest.mark.parametrize("arch", arches.RUNTIME_ARCHES)
def test_qemu_arena_fits_the_guest(arch: str) -> None:
    # Below 2 GiB (32-bit absolute relocations fit), page-aligned, non-empty.
    start, end = by_name(arch).qemu.arena
    assert 0 < start < end <= 0x8000_0000 and start % 4096 == end % 4096 == 0


@pytest.mark.parametrize("info", [a for a in arches.TABLE if a.narrow], ids=lambda a: a.name)
@pytest.mark.parametrize("bits", [64, 32])
def test_host_picks_the_family_member_of_the_interpreter(info, bits, monkeypatch) -> None:
    # A 32-bit interpreter on a 64-bit kernel of the family runs `narrow`.
    monkeypatch.setattr(arches.platform, "machine", lambda: info.host_names[0])
    monkeypatch.setattr(arches, "struct", type("S", (), {
        "calcsize": staticmethod(lambda fmt: bits // 8)}))
    found = arches.host()
    assert found is not None
    assert found.name == (info.name if bits == 64 else info.narrow)
