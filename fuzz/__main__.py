"""``python -m fuzz``: see :mod:`fuzz.cli`."""

import os

# One thread per process: children are forked from this one, and numpy's
# BLAS would otherwise start a thread pool at import.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from .cli import main  # noqa: E402

raise SystemExit(main())
