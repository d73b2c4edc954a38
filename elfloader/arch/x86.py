"""Shared parts of x86_64 and x86_32: where qemu-user reports a fault
fetching a branch's target."""

#: Mnemonic starts of the calls, jumps (``jcc`` too) and returns at whose
#: pc qemu-user reports a fault fetching their target (real CPUs and
#: unicorn report it at the target).
QEMU_BRANCHES = ("call", "jmp", "ret", "j", "loop")
