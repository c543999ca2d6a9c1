"""How many threads one large call may use.

The default is the number of cores this process may run on, or the value of
the environment variable ``POSENC_FAST_NUM_THREADS`` read at import.  Small
calls always stay on one thread: waking workers costs more than it saves.
A call may also run on fewer threads than this while the thread pool backs
off after a call that waited on a worker without a core (see
``csrc/posenc_pool.h``); the results are the same on any number of threads.
"""

import os
import warnings

from ._dispatch import kernels
from ._validate import integer

ENV_VAR = "POSENC_FAST_NUM_THREADS"
# Elements (of x, or of a table written) below which a call stays on one thread.
MIN_ELEMENTS_PER_THREAD = 1 << 16
# The kernels take a C int thread count: larger requests are clamped to this.
MAX_KERNEL_THREADS = 1 << 15


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _from_environment() -> int:
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return _available_cores()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        warnings.warn(f"{ENV_VAR}={text!r} is not a positive integer; using "
                      f"{_available_cores()} threads", RuntimeWarning, stacklevel=3)
        return _available_cores()
    return value


_num_threads = _from_environment()
kernels.set_thread_limit(min(_num_threads, MAX_KERNEL_THREADS), MIN_ELEMENTS_PER_THREAD)


def set_num_threads(n: int) -> None:
    """Set how many threads one large call may use.

    Parameters
    ----------
    n : int
        At least 1; counts above 32768 act as 32768.  Takes effect for
        calls that start afterwards; calls already running keep the count
        they started with.

    Raises
    ------
    TypeError
        If `n` is not an integer (a bool, Python's or NumPy's, is not).
    ValueError
        If `n` < 1.
    """
    global _num_threads
    n = integer(n, "n", minimum=1)
    kernels.set_thread_limit(min(n, MAX_KERNEL_THREADS), MIN_ELEMENTS_PER_THREAD)
    _num_threads = n


def get_num_threads() -> int:
    """Return how many threads one large call may use."""
    return _num_threads


def threads_for(elements: int) -> int:
    """Threads for a call that touches `elements` values: 1 for small calls."""
    return max(1, min(_num_threads, MAX_KERNEL_THREADS, elements // MIN_ELEMENTS_PER_THREAD))
