"""Processes that load the machine beside a measurement: a memory-bandwidth hog, a busy loop.

``with Neighbour("hog"):`` runs a process looping ``np.add(a, 1, out=a)``
over 256 MiB (reading and writing memory as fast as one core can);
``Neighbour("busy", nice=19)`` a pure-Python busy loop (one core's worth of
CPU, no memory traffic) at that niceness.  The process has started its loop
when ``__enter__`` returns and is stopped when the block exits, however it
exits (an exception, Ctrl-C); if this process dies without cleaning up, the
child notices its parent is gone and stops by itself.  ``summary()`` says
what it did, so a table can show that it ran.
"""

from __future__ import annotations

import os
import subprocess
import sys

HOG_BYTES = 256 << 20

_CHILD = r"""
import os, signal, sys, time
kind, nice, parent, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.nice(nice)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
passes, start = 0, time.perf_counter()
try:
    if kind == "hog":
        import numpy as np
        a = np.zeros(nbytes // 8)
        print("ready", flush=True)
        while os.getppid() == parent:
            np.add(a, 1, out=a)
            passes += 1
    else:
        print("ready", flush=True)
        while os.getppid() == parent:
            for _ in range(100_000):
                pass
            passes += 1
finally:
    print(passes, time.perf_counter() - start, flush=True)
"""

KINDS = {
    "hog": f"a process looping np.add(a, 1, out=a) over {HOG_BYTES >> 20} MiB",
    "busy": "a CPU-bound process (pure-Python busy loop)",
}


class Neighbour:
    """A child process running `kind` ("hog" or "busy") at niceness `nice`; a context manager."""

    def __init__(self, kind: str, nice: int = 0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be in [0, 19], got {nice!r}")
        self.kind, self.nice = kind, nice
        self.proc = None
        self.passes = self.seconds = None
        self.early_exit = None      # the exit status if it stopped before stop()

    def __enter__(self) -> Neighbour:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, self.kind, str(self.nice), str(os.getpid()),
             str(HOG_BYTES)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            _, err = self.proc.communicate()
            raise RuntimeError(f"the {self.kind} process did not start: {err.strip()[-500:]}")
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def stop(self) -> None:
        """Stop the process (terminate; kill if it has not gone within 10 s); idempotent."""
        if self.proc is None or self.passes is not None:
            return
        self.early_exit = self.proc.poll()
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        fields = out.split()
        if len(fields) == 2:   # passes, seconds
            self.passes, self.seconds = int(fields[-2]), float(fields[-1])
        else:
            self.passes, self.seconds = 0, 0.0

    def summary(self) -> str:
        """What the process was and, once stopped, what it did."""
        text = KINDS[self.kind] + (f" at nice {self.nice}" if self.nice else "")
        if self.passes is None:
            return text
        text += f": {self.passes} passes in {self.seconds:.0f} s"
        if self.kind == "hog" and self.seconds:
            text += f" ({2 * HOG_BYTES * self.passes / self.seconds / 1e9:.1f} GB/s read+write)"
        if self.early_exit is not None:
            text += f"; IT EXITED EARLY (status {self.early_exit})"
        return text
