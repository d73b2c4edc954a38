"""Ctrl-C for emulated calls.

Python runs its SIGINT handler (which raises :class:`KeyboardInterrupt`)
only between bytecodes of the main thread, never during a long call into
C such as the emulator's run loop: a call that loops forever cannot be
interrupted. :func:`run_interruptible` runs the call on a helper thread
(the emulator releases the GIL while it runs) while the main thread waits,
interruptibly; on Ctrl-C it asks the backend to stop its CPUs
(:meth:`elfloader.Backend.stop_workers`), waits for the call to end and
raises :class:`KeyboardInterrupt`.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run_interruptible(fn: Callable[[], T], stop: Callable[[], None]) -> T:
    """``fn()``, run so that Ctrl-C interrupts it at once.

    On the main thread, ``fn`` runs on a helper thread; a
    :class:`KeyboardInterrupt` while waiting for it calls ``stop()`` (which
    must make ``fn`` return or raise soon, e.g. ``lambda:
    backend.stop_workers(n)``), waits for ``fn`` to end and is re-raised.
    Elsewhere ``fn`` runs on the calling thread.

    Returns:
        what ``fn`` returned; whatever it raised is raised here.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn()
    outcome: list = []
    done = threading.Event()

    def body():
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            outcome.append((False, exc))
        finally:
            done.set()

    # Waiting on an event, not Thread.join(): a join interrupted by Ctrl-C
    # may take the thread for finished while it still runs.
    thread = threading.Thread(target=body, name="guest-call", daemon=True)
    thread.start()
    try:
        done.wait()
    except KeyboardInterrupt:
        stop()
        while True:
            try:
                if done.wait(0.05):
                    break
                stop()   # a call that started after the first request
            except KeyboardInterrupt:
                pass     # still stopping: the call must end first
        raise
    ok, value = outcome[0]
    if ok:
        return value
    raise value
