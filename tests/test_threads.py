"""One Executable shared by threads: concurrent dispatches of several
exports give exactly the single-threaded results on both backends;
close() during dispatches and fork() during dispatches end in success or
typed errors, never a crash, a wrong result or a deadlock.

The stress figure is ``PKR_STRESS_DISPATCHES`` dispatches per case (default
a CI-sized 400; the acceptance run uses 10000)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import elfloader
from fatelf.errors import PortableKernelError
from hal_cpu import Executable, LibraryError
from hal_cpu.programs.vm import plan_program, run_plan

HOST = elfloader.arch.host()
native_only = pytest.mark.skipif(HOST is None or HOST.name != "x86_64",
                                 reason="native case needs an x86_64 host")
DISPATCHES = int(os.environ.get("PKR_STRESS_DISPATCHES", "400"))
THREADS = 4
#: (architecture, backend, workers) of each stress case; mm_rowsum's
#: executable has two exports (a matmul and a tanh row sum).
CASES = [pytest.param("x86_64", "native", None, marks=native_only,
                      id="native-default-workers"),
         pytest.param("x86_64", "native", 2, marks=native_only,
                      id="native-2-workers"),
         pytest.param("x86_64", "emulated", None, id="emulated-x86_64"),
         pytest.param("aarch64", "emulated", 2, id="emulated-aarch64-2-workers"),
         pytest.param("riscv32", "emulated", None, id="emulated-riscv32")]
JOIN_SECONDS = 120


class Program:
    """mm_rowsum's plan, its inputs and the single-threaded results."""

    def __init__(self, compiled, arch: str, backend: str, workers):
        prog = compiled("mm_rowsum", arch)
        rng = np.random.default_rng(7)
        self.inputs = [rng.random((37, 53), dtype=np.float32),
                       rng.random((53, 29), dtype=np.float32)]
        self.plan = plan_program(prog, self.inputs, "mm_rowsum")
        self.exe = Executable(prog.so_files[0], backend=backend)
        self.workers = workers
        self.reference = self.run()

    def dispatch(self, step, bindings) -> None:
        self.exe.dispatch(step.export_name, step.workgroup_count, bindings,
                          step.constants, workers=self.workers)

    def run(self) -> list[np.ndarray]:
        return run_plan(self.plan, self.inputs, self.dispatch)

    def correct(self, results) -> bool:
        return all(np.array_equal(r, e) for r, e in zip(results, self.reference))


def _join(threads) -> None:
    deadline = time.monotonic() + JOIN_SECONDS
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread hung"


@pytest.mark.parametrize("arch,backend,workers", CASES)
def test_threads_share_one_executable(compiled, arch, backend, workers):
    program = Program(compiled, arch, backend, workers)
    per_thread = -(-DISPATCHES // (THREADS * len(program.plan.dispatches)))
    wrong, errors = [], []

    def work():
        for _ in range(per_thread):
            try:
                results = program.run()
            except Exception as exc:  # noqa: BLE001 - counted, reported below
                errors.append(exc)
                continue
            if not program.correct(results):
                wrong.append(results)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    _join(threads)
    program.exe.close()
    runs = per_thread * THREADS * len(program.plan.dispatches)
    assert runs >= DISPATCHES
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} wrong results in {runs} dispatches"


@pytest.mark.parametrize("arch,backend,workers", CASES[1:4])
def test_close_while_threads_dispatch(compiled, arch, backend, workers):
    """close() waits for the running dispatches; later ones raise
    LibraryError; every result that came back is right."""
    program = Program(compiled, arch, backend, workers)
    done, wrong, other = [0], [], []
    refused = []
    started = threading.Barrier(THREADS + 1)

    def work():
        started.wait()
        while True:
            try:
                results = program.run()
            except LibraryError as exc:
                refused.append(exc)
                return
            except Exception as exc:  # noqa: BLE001 - must not happen
                other.append(exc)
                return
            done[0] += 1
            if not program.correct(results):
                wrong.append(results)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(0.05)
    program.exe.close()
    _join(threads)
    assert not other and not wrong, (other[:3], len(wrong))
    assert len(refused) == THREADS
    assert all("closed" in str(e) and e.name == program.exe.path
               for e in refused)
    with pytest.raises(elfloader.BackendError, match="closed"):
        program.exe.backend.read(program.exe.module.base, 16)
    with pytest.raises(elfloader.BackendError, match="closed"):
        program.exe.backend.write(program.exe.module.base, b"x")


@pytest.mark.parametrize("arch,backend,workers", CASES[1:3])
def test_close_from_a_progress_callback(compiled, arch, backend, workers):
    """A dispatch's own progress callback may close the executable: the
    dispatch finishes, the library is freed when it ends."""
    program = Program(compiled, arch, backend, workers)
    step = program.plan.dispatches[0]
    bindings = [np.zeros(b.length, np.uint8) for b in step.bindings]
    program.exe.dispatch(step.export_name, step.workgroup_count, bindings,
                         step.constants, progress=lambda d, t: program.exe.close())
    with pytest.raises(LibraryError, match="closed"):
        program.exe.dispatch(step.export_name, step.workgroup_count, bindings,
                             step.constants)
    with pytest.raises(elfloader.BackendError, match="closed"):
        program.exe.backend.read(program.exe.module.base, 16)


def _wait_child(pid: int, seconds: float) -> int | None:
    """The child's exit code, or None when it did not end in time (it is
    killed then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


FORKS = 8


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.parametrize("arch,backend,workers", CASES[1:4])
def test_fork_while_threads_dispatch(compiled, arch, backend, workers):
    """A child forked while other threads dispatch can dispatch on the
    inherited executable (or gets a typed error), and never hangs on a
    lock one of those threads held."""
    program = Program(compiled, arch, backend, workers)
    stop = threading.Event()
    wrong = []

    def work():
        while not stop.is_set():
            if not program.correct(program.run()):
                wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(THREADS - 1)]
    for t in threads:
        t.start()
    codes = []
    try:
        for _ in range(FORKS):
            time.sleep(0.01)
            pid = os.fork()
            if pid == 0:  # child: one dispatch, then the exit code says how
                code = 3
                try:
                    code = 0 if program.correct(program.run()) else 2
                except PortableKernelError:
                    code = 1
                finally:
                    os._exit(code)
            codes.append(_wait_child(pid, 30))
    finally:
        stop.set()
        _join(threads)
        program.exe.close()
    assert not wrong
    assert None not in codes, f"a forked child hung: {codes}"
    assert set(codes) <= {0, 1}, codes


@pytest.mark.requires("qemu-user")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_never_touches_the_parents_agents(compiled):
    """In a forked child, every guest agent of the parent refuses its pipes
    (a request the child wrote, or a reply it read, would belong to a call
    of the parent's, which would then wait for it forever), and a dispatch
    is a typed error; the parent's agents stay quiet and keep working."""
    from elfloader.backend.emulated import qemu_engine

    program = Program(compiled, "x86_64", "emulated", 2)
    try:
        agents = [cpu._agent for cpu in program.exe.backend.state.cpus
                  if getattr(cpu, "_agent", None) is not None
                  and not cpu._agent.closed]
        assert agents, "no running guest agent to inherit"
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for agent in agents:
                    for use in (lambda: agent.send(0), agent.recv,
                                agent.expect_quiet):
                        try:
                            use()
                            code = 2
                        except qemu_engine.EngineError as exc:
                            if "belongs to the parent" not in str(exc):
                                code = 3
                try:
                    program.run()
                    code = 4
                except PortableKernelError:
                    pass
            finally:
                os._exit(code)
        assert _wait_child(pid, 30) == 0
        for agent in agents:
            agent.expect_quiet()
        assert program.correct(program.run())
    finally:
        program.exe.close()


def test_threads_share_an_arm32_sample():
    """The bundled arm32 matmul (32-bit, emulated), four threads."""
    import json
    from pathlib import Path

    import hal_cpu
    samples = Path(hal_cpu.__file__).parent / "samples"
    kernel = json.loads((samples / "manifest.json").read_text())["kernels"]["matmul"]
    entry = kernel["per_arch"]["arm32"]
    rng = np.random.default_rng(3)
    a = rng.random((13, 17), dtype=np.float32)
    b = rng.random((17, 11), dtype=np.float32)
    wrong, errors = [], []
    per_thread = -(-DISPATCHES // THREADS)
    with Executable(samples / entry["file"], backend="emulated") as exe:
        want = np.zeros((13, 11), np.float32)
        exe.dispatch(kernel["export"], entry["workgroup_count"], [a, b, want])

        def work():
            for _ in range(per_thread):
                c = np.zeros((13, 11), np.float32)
                try:
                    exe.dispatch(kernel["export"], entry["workgroup_count"],
                                 [a, b, c])
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                    return
                if not np.array_equal(c, want):
                    wrong.append(c)

        threads = [threading.Thread(target=work) for _ in range(THREADS)]
        for t in threads:
            t.start()
        _join(threads)
    assert np.allclose(want, a @ b, atol=1e-4)
    assert not errors and not wrong, (errors[:3], len(wrong))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_does_not_wait_forever_for_a_space_lock_held_by_another_thread():
    """fork() holds every emulated space's lock across the fork; one that
    another thread keeps (it may itself be forking: subprocess with a
    preexec_fn runs the same hooks, and waits for a lock this thread took)
    is waited for at most FORK_LOCK_WAIT, and that space is closed in the
    child, while a space whose lock was free stays usable there."""
    from elfloader import BackendError
    from elfloader.backend.emulated import EmulatedBackend
    from elfloader.backend.emulated import space as space_module

    arch = elfloader.arch.by_name("x86_64")
    busy = EmulatedBackend(arch, engine="unicorn")
    free = EmulatedBackend(arch, engine="unicorn")
    busy_at, free_at = busy.alloc_bytes(b"busy"), free.alloc_bytes(b"free")
    holding, done = threading.Event(), threading.Event()

    def hold():
        with busy.state.lock:
            holding.set()
            done.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if free.read(free_at, 4) != b"free" or not busy.closed:
                    code = 2
                try:
                    busy.read(busy_at, 4)
                    code = 3
                except BackendError:
                    pass
            except BaseException:
                code = 4
            finally:
                os._exit(code)
        waited = time.monotonic() - start
        done.set()
        assert _wait_child(pid, 30) == 0
        assert waited < space_module.FORK_LOCK_WAIT + 5
        assert not busy.closed and busy.read(busy_at, 4) == b"busy"
    finally:
        done.set()
        holder.join(10)
        busy.close()
        free.close()
