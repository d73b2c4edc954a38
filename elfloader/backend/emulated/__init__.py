"""The emulated backend: guest code of any supported architecture on any
host, on one of two engines.

* :mod:`.space` — :class:`EmulatedBackend`: the address space (allocator,
  page map log, guarded ranges, calls and callbacks), engine-neutral.
* :mod:`.state` — what the space shares with its CPUs (page map, memory-map
  log, callbacks, CPUs, lock); :mod:`.pages` — the page map;
  :mod:`.guarded` — canaries of guarded ranges.
* :mod:`.engine` — the engine contract; :mod:`.choice` — the choice of
  engine (:func:`~.choice.choose`) and qemu-user's facts.
* :mod:`.qemu_engine` — qemu-user running a guest agent (``agent/``);
  vector ISAs at qemu-user's speed.
* :mod:`.unicorn_engine` and :mod:`.unicorn_arch` — unicorn CPUs in this
  process.
"""

from ...errors import EngineError
from .choice import ENGINES, choose, qemu_program
from .space import STACK_SIZE, EmulatedBackend

__all__ = ["EmulatedBackend", "EngineError", "ENGINES", "STACK_SIZE", "choose",
           "qemu_program"]
