"""Many Python threads calling posenc_fast at once.

The kernels release the GIL, so threads really run in parallel; every result
must be bitwise the one a serial call gives.  Also: changing the thread count
while other threads compute, and the RoPE fast path's per-instance cos/sin
cache growing while other threads read it.  How much two threads gain
(the GIL released) is measured, not asserted: ``bench/bench_gil.py``.
"""

import threading

import numpy as np
import pytest

import posenc_fast as pf

THREADS = 8


def run_threads(target, n=THREADS):
    """Run target(i) in n threads released together; re-raise the first error."""
    barrier = threading.Barrier(n)
    errors = []
    results = [None] * n

    def worker(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def restore_threads():
    before = pf.get_num_threads()
    yield
    pf.set_num_threads(before)


def _inputs(seed, shape=(2, 4, 300, 64), dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _jobs(shared_q, shared_k, shared_scores):
    """Calls of the four main functions: (name, function of a thread index)."""
    rope = pf.RotaryEmbedding(64, layout="half")
    positions = np.arange(300, dtype=np.int64)[::-1].copy()
    return {
        "apply_own": lambda i: rope.apply(_inputs(i), offset=17 * i),
        "apply_shared": lambda i: rope.apply(shared_q, positions, offset=i),
        "apply_general": lambda i: rope.apply(shared_q[..., ::-1, :], offset=0.5 * i),
        "apply_qk": lambda i: rope.apply_qk(shared_q, shared_k, offset=1000 * i),
        "sinusoidal_table": lambda i: pf.sinusoidal_table(1000 + i, 96, offset=i * 3000,
                                                          dtype=np.float64 if i % 2 else np.float32),
        "add_alibi_shared": lambda i: pf.add_alibi(shared_scores, offset=i, causal=bool(i % 2)),
        "add_alibi_own": lambda i: pf.add_alibi(_inputs(i, (2, 8, 16, 300)), offset=i),
    }


@pytest.mark.parametrize("job", ["apply_own", "apply_shared", "apply_general", "apply_qk",
                                 "sinusoidal_table", "add_alibi_shared", "add_alibi_own"])
def test_threads_match_serial_calls_bitwise(job):
    shared_q = _inputs(100)
    shared_k = _inputs(101, (2, 2, 300, 64), np.float64)
    shared_scores = _inputs(102, (2, 8, 16, 300))
    for a in (shared_q, shared_k, shared_scores):
        a.flags.writeable = False  # shared inputs are read-only
    before = [a.tobytes() for a in (shared_q, shared_k, shared_scores)]
    target = _jobs(shared_q, shared_k, shared_scores)[job]
    serial = [target(i) for i in range(THREADS)]
    for _ in range(3):
        parallel = run_threads(target)
        for want, got in zip(serial, parallel):
            for w, g in zip(want if isinstance(want, tuple) else (want,),
                            got if isinstance(got, tuple) else (got,)):
                assert w.tobytes() == g.tobytes()
    assert [a.tobytes() for a in (shared_q, shared_k, shared_scores)] == before


def test_threads_mixing_all_functions_match_serial_calls():
    shared_q = _inputs(200)
    shared_k = _inputs(201, (2, 2, 300, 64), np.float64)
    shared_scores = _inputs(202, (2, 8, 16, 300))
    jobs = list(_jobs(shared_q, shared_k, shared_scores).values())
    serial = {(j, i): jobs[j](i) for j in range(len(jobs)) for i in range(THREADS)}

    def target(i):
        return {(j, i): jobs[j](i) for j in (list(range(len(jobs)))[i % 3:] + list(range(i % 3)))}

    for result in run_threads(target):
        for key, got in result.items():
            want = serial[key]
            for w, g in zip(want if isinstance(want, tuple) else (want,),
                            got if isinstance(got, tuple) else (got,)):
                assert w.tobytes() == g.tobytes()


def test_in_place_calls_on_separate_arrays_in_threads():
    rope = pf.RotaryEmbedding(128, rotary_dim=64)
    arrays = [_inputs(300 + i, (1, 8, 256, 128)) for i in range(THREADS)]
    want = [rope.apply(a, offset=i) for i, a in enumerate(arrays)]
    run_threads(lambda i: rope.apply(arrays[i], offset=i, out=arrays[i]))
    for w, a in zip(want, arrays):
        assert w.tobytes() == a.tobytes()


def test_set_num_threads_while_other_threads_compute(restore_threads):
    x = _inputs(400, (4, 8, 512, 64))  # large: multi-threaded calls
    scores = _inputs(401, (2, 8, 64, 512))
    rope = pf.RotaryEmbedding(64)
    want_rot = rope.apply(x, offset=5)
    want_table = pf.sinusoidal_table(70000, 16)
    want_alibi = pf.add_alibi(scores)
    stop = threading.Event()

    def toggler():
        n = 0
        while not stop.is_set():
            pf.set_num_threads(1 + n % 4)
            n += 1

    def target(i):
        for _ in range(5):
            if i % 3 == 0:
                assert rope.apply(x, offset=5).tobytes() == want_rot.tobytes()
            elif i % 3 == 1:
                assert pf.sinusoidal_table(70000, 16).tobytes() == want_table.tobytes()
            else:
                assert pf.add_alibi(scores).tobytes() == want_alibi.tobytes()

    t = threading.Thread(target=toggler)
    t.start()
    try:
        run_threads(target, n=6)
    finally:
        stop.set()
        t.join()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rope_cache_grows_while_other_threads_read_it(dtype):
    # One embedding shared by all threads, each calling with increasing offsets
    # so the per-instance cos/sin cache grows (and is replaced) while others
    # read it; every result must equal a fresh embedding's, bitwise.
    shared = pf.RotaryEmbedding(64, layout="half", scaling={"rope_type": "linear", "factor": 2.0})
    x = _inputs(500, (1, 2, 64, 64), dtype)
    offsets = [[(i + THREADS * step) * 700 + 13 * i for step in range(12)]
               for i in range(THREADS)]

    def target(i):
        return [shared.apply(x, offset=o) for o in offsets[i]]

    results = run_threads(target)
    fresh = pf.RotaryEmbedding(64, layout="half", scaling={"rope_type": "linear", "factor": 2.0})
    for i in range(THREADS):
        for o, got in zip(offsets[i], results[i]):
            assert got.tobytes() == fresh.apply(x, offset=o).tobytes()
            # ... and the general (Python) path gives the same bits.
            assert got.tobytes() == fresh.apply(x, offset=float(o)).tobytes()


def test_rope_cache_growth_with_apply_qk_and_positions():
    shared = pf.RotaryEmbedding(32)
    q = _inputs(600, (3, 4, 16, 32))
    k = _inputs(601, (3, 1, 16, 32))

    def target(i):
        out = []
        for step in range(10):
            p = np.arange(16, dtype=np.int64) * (i + 1) + step * 5000
            out.append((p, shared.apply_qk(q, k, p)))
        return out

    results = run_threads(target)
    fresh = pf.RotaryEmbedding(32)
    for result in results:
        for p, (q_rot, k_rot) in result:
            want_q, want_k = fresh.apply_qk(q, k, p)
            assert q_rot.tobytes() == want_q.tobytes() and k_rot.tobytes() == want_k.tobytes()
