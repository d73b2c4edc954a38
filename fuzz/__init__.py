"""A fuzz harness for the claim "every input file is hostile until verified".

``python -m fuzz --cases 2000 --seed 1 --backend both --target all --jobs 2
--report out.json`` mutates the repository's own IREE executables
(``hal_cpu/samples``), embedded plugins and FatELF bundles field by field
(:mod:`fuzz.mutate`, on the field map of :mod:`fuzz.model`), runs each
mutated file in a child process the way a user would (:mod:`fuzz.child`),
and classifies what happened (:mod:`fuzz.runner`): accepted, a typed
:class:`fatelf.PortableKernelError`, an escaped exception, a crash (and
whether it was inside the file's own code running natively), a hang or a
resource blowup. Problem cases are saved for ``python -m fuzz --replay
FILE`` and reduced to fewer byte operations. ``--target code``
(:mod:`fuzz.code`) plants hostile machine code in the dispatched export
and checks after each case that the host's canaries are untouched.
"""
