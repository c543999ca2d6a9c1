"""The thread policy (csrc/posenc_pool.h): a call never waits for a worker that has no core.

Correctness of the policy, never timing: workers are held back on purpose
(``_core.hold_workers``) after they join a call, as a worker without a core
would be.  The call must still finish, on the caller's thread alone, with
the exact result; workers released afterwards must not touch that call or
the next one.
"""

import threading

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
