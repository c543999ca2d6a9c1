"""The thread policy (csrc/posenc_pool.h): a call never waits for a worker that has no core.

Correctness of the policy, never timing: workers are held back on purpose
(``_core.hold_workers``) after they join a call, as a worker without a core
would be.  The call must still finish, on the caller's thread alone, with
the exact result; workers released afterwards must not touch that call or
the next one.  Workers held while they run an item make the call late: the
back-off that follows is checked call by call (``_core.pool_counts``).
"""

import os
import threading
import time

import numpy as np
import pytest

import posenc_fast as pf
from posenc_fast import _core

pytestmark = pytest.mark.skipif(not _core.thread_pool_enabled(), reason="built without the pool")

SHAPE = (1, 32, 512, 128)  # 8 MiB float32: well past the one-thread threshold
# A call that waited for a held worker would never end; this bounds the test, not a speed.
DEADLOCK_SECONDS = 120


@pytest.fixture
def four_threads():
    before = pf.get_num_threads()
    pf.set_num_threads(4)
    yield
    _core.hold_workers(False)
    pf.set_num_threads(before)


def _apply(rope, x):
    return rope.apply(x, out=np.empty_like(x))


def test_a_call_finishes_without_its_workers(four_threads):
    rope = pf.RotaryEmbedding(128)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    pf.set_num_threads(1)
    want = _apply(rope, x)
    pf.set_num_threads(4)
    _apply(rope, x)  # starts the workers
    _core.hold_workers(True)
    before = _core.pool_counts()["worker_items"]
    result = {}
    caller = threading.Thread(target=lambda: result.update(got=_apply(rope, x)), daemon=True)
    caller.start()
    caller.join(DEADLOCK_SECONDS)
    assert not caller.is_alive(), "the call waited for workers that never ran"
    assert _core.pool_counts()["worker_items"] == before, "a held worker ran an item"
    assert result["got"].tobytes() == want.tobytes()
    # Released workers find their call over: they must not touch the next one.
    _core.hold_workers(False)
    for _ in range(20):
        assert _apply(rope, x).tobytes() == want.tobytes()


def test_every_parallel_path_is_exact_with_held_workers(four_threads):
    rng = np.random.default_rng(1)
    rope = pf.RotaryEmbedding(128)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    positions = rng.integers(0, 4096, SHAPE[2])
    scores = rng.standard_normal((8, 256, 256)).astype(np.float32)
    calls = {
        "apply": lambda: rope.apply(x),
        "apply positions": lambda: rope.apply(x, positions),
        "cos_sin": lambda: np.stack(rope.cos_sin(np.arange(70000))),
        "sinusoidal": lambda: pf.sinusoidal_table(4096, 256),
        "add_alibi": lambda: pf.add_alibi(scores),
    }
    pf.set_num_threads(1)
    want = {name: call() for name, call in calls.items()}
    pf.set_num_threads(4)
    for name, call in calls.items():
        assert call().tobytes() == want[name].tobytes(), name
    _core.hold_workers(True)
    for name, call in calls.items():
        assert call().tobytes() == want[name].tobytes(), name
    _core.hold_workers(False)


# The back-off (csrc/posenc_pool.h): after a call whose caller waited on a
# stalled worker longer than it worked, calls run on fewer threads for a
# while.  Driven by held workers, so every step is decided, not timed.
FIRST, LONGEST, CLEAN = _core.POOL_BACKOFF
SMALL = (1, 8, 256, 128)  # 1 MiB float32: 4 threads, 8 items


def _late_call(call):
    """Run `call` with every worker stalled on an item until its caller has judged them late."""
    _core.hold_workers("on_item")
    result = {}
    caller = threading.Thread(target=lambda: result.update(got=call()), daemon=True)
    caller.start()
    deadline = time.monotonic() + DEADLOCK_SECONDS
    while _core.pool_counts()["caller_waiting"] != 2:
        assert caller.is_alive(), "the call did not wait for its stalled workers"
        assert time.monotonic() < deadline, "the caller never judged its stalled workers late"
        time.sleep(0.001)
    _core.hold_workers(False)
    caller.join(DEADLOCK_SECONDS)
    assert not caller.is_alive(), "the call did not end after its workers were released"
    return result["got"]


@pytest.fixture
def backoff(four_threads):
    rope = pf.RotaryEmbedding(128)
    x = np.random.default_rng(2).standard_normal(SMALL).astype(np.float32)
    rope.apply(x)  # builds the cos/sin cache (a call of its own)
    _core.reset_backoff()
    yield rope, x
    _core.hold_workers(False)
    _core.reset_backoff()


def test_a_late_call_backs_off_then_probes(backoff):
    rope, x = backoff
    pf.set_num_threads(1)
    want = rope.apply(x)
    pf.set_num_threads(4)
    for period in (FIRST, 2 * FIRST):
        inplace = x.copy()
        before = _core.pool_counts()
        # In place: the stalled items are computed once, by their workers, before the call returns.
        assert _late_call(lambda: rope.apply(inplace, out=inplace)) is inplace
        assert inplace.tobytes() == want.tobytes()
        counts = _core.pool_counts()
        assert counts["late"] == before["late"] + 1
        assert (counts["period"], counts["left"], counts["cap"]) == (period, period, 1)
        # Backed off: the next `period` calls run on the caller alone; then a probe uses threads.
        for _ in range(period):
            assert rope.apply(x).tobytes() == want.tobytes()
        counts = _core.pool_counts()
        assert counts["capped"] == before["capped"] + period
        assert counts["worker_items"] == before["worker_items"] + 3  # the 3 stalled items only
        assert counts["left"] == 0


def test_the_back_off_doubles_up_to_its_longest_and_clean_calls_halve_it(backoff):
    rope, x = backoff
    periods = []
    for _ in range(LONGEST.bit_length() - FIRST.bit_length() + 2):
        _late_call(lambda: rope.apply(x))
        periods.append(_core.pool_counts()["period"])
        for _ in range(periods[-1]):
            rope.apply(x)
    assert periods == [FIRST << k for k in range(len(periods) - 1)] + [LONGEST]
    # Calls with all their threads and no late worker (held before any item:
    # the caller runs every item and never waits) halve the period.
    _core.hold_workers(True)
    halved = []
    while not halved or halved[-1] > 0:
        assert len(halved) < LONGEST.bit_length(), f"clean calls did not end the back-off: {halved}"
        before = _core.pool_counts()
        for _ in range(CLEAN):
            rope.apply(x)
        counts = _core.pool_counts()
        assert counts["capped"] == before["capped"] and counts["late"] == before["late"]
        halved.append(counts["period"])
    assert halved == [LONGEST >> k for k in range(1, len(halved))] + [0]
    assert halved[-2] == FIRST


@pytest.fixture
def one_cpu(four_threads):
    """Every thread of this process on one CPU: a worker can only run instead of its caller."""
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):
        pytest.skip("needs Linux thread affinity")
    rope = pf.RotaryEmbedding(128)
    rope.apply(np.zeros(SHAPE, np.float32))  # starts the workers and builds the cos/sin cache
    threads = {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}
    cpu = min(os.sched_getaffinity(0))
    for tid in threads:
        _set_affinity(tid, {cpu})
    yield rope
    for tid, cpus in threads.items():
        _set_affinity(tid, cpus)


def _set_affinity(tid, cpus):
    try:
        os.sched_setaffinity(tid, cpus)
    except ProcessLookupError:  # a thread that has ended meanwhile
        pass


def test_a_worker_on_its_callers_cpu_leaves_the_call_to_it(one_cpu):
    rope = one_cpu
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)  # 50 calls span ticks
    pf.set_num_threads(1)
    want = rope.apply(x)
    pf.set_num_threads(4)
    _core.reset_backoff()
    before = _core.pool_counts()
    for _ in range(50):
        assert rope.apply(x).tobytes() == want.tobytes()
    counts = _core.pool_counts()
    assert counts["worker_items"] == before["worker_items"], "a worker ran in place of its caller"
    assert counts["calls"] - before["calls"] == 50 and counts["capped"] == before["capped"]
    # Workers run only when the caller does not (while this thread sleeps here).
    deadline = time.monotonic() + DEADLOCK_SECONDS
    while _core.pool_counts()["stood_down"] == before["stood_down"]:
        assert time.monotonic() < deadline, "no worker ever ran"
        time.sleep(0.01)


@pytest.mark.skipif(not _core.thread_pool_enabled(), reason="built without the thread pool")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: a pool without workers")
def test_set_num_threads_limits_what_the_kernels_ask_for():
    # One thread: a large call never goes to the pool; two: the same call does.
    x = np.ones((1, 8, 1024, 128), np.float32)
    rope = pf.RotaryEmbedding(128)
    before = pf.get_num_threads()
    try:
        for threads, asks in ((1, False), (2, True)):
            pf.set_num_threads(threads)
            calls = _core.pool_counts()["calls"]
            rope.apply(x, out=x)
            assert (_core.pool_counts()["calls"] > calls) == asks, threads
    finally:
        pf.set_num_threads(before)
