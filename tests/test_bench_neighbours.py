"""The timing tools of bench/: rounds whose orders put every callable after every other, the
contention tools of bench/report.py (single-call timing in interleaved blocks, the neighbour
processes, started before the block, gone after it however it exits), and rounds joined over
several placements of the arrays."""

import pytest

from posenc_fast._bench import timing
from posenc_fast._bench.neighbours import Neighbour


def test_measure_runs_each_callable_after_every_other():
    # a callable always run right after the same one (a rotation keeps the cyclic order) is always
    # timed on the caches that one left: 15% apart for the same code (bench/README.md, stop 55)
    calls = []
    funcs = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    timings = timing.measure(funcs, rounds=40, target_ns=1, warmup=0)
    assert all(len(t.samples) == 40 for t in timings.values())
    rounds = calls[-160:]  # after the calibration's calls
    assert all(sorted(rounds[i:i + 4]) == list("abcd") for i in range(0, 160, 4))  # each once a round
    after = {(rounds[i - 1], rounds[i]) for i in range(1, 160)}
    assert all((x, y) in after for x in "abcd" for y in "abcd" if x != y)


def test_per_call_times_interleaves_blocks():
    calls = []
    times = timing.per_call_times(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, calls=12, block=3,
        before={"a": lambda: calls.append("set a"), "b": lambda: calls.append("set b")})
    assert len(times["a"]) == len(times["b"]) == 12
    assert all(t >= 0 for t in times["a"] + times["b"])
    timed = calls[4:]   # after the warm-up: set a, a, set b, b
    assert calls[:4] == ["set a", "a", "set b", "b"]
    blocks = [timed[i:i + 4] for i in range(0, len(timed), 4)]
    assert blocks == [["set a", "a", "a", "a"], ["set b", "b", "b", "b"],
                      ["set b", "b", "b", "b"], ["set a", "a", "a", "a"]] * 2


def test_percentile():
    assert timing.percentile(range(101), 99) == 99.0
    assert timing.percentile([3, 1, 2], 50) == 2.0


@pytest.mark.parametrize("kind, nice", [("hog", 0), ("busy", 19)])
def test_neighbour_runs_inside_the_block_only(kind, nice):
    with Neighbour(kind, nice) as neighbour:
        assert neighbour.proc.poll() is None
    assert neighbour.proc.poll() is not None
    assert neighbour.early_exit is None and neighbour.passes >= 0
    assert "passes in" in neighbour.summary()


def test_neighbour_stops_when_the_block_raises():
    with pytest.raises(KeyboardInterrupt):
        with Neighbour("busy") as neighbour:
            raise KeyboardInterrupt
    assert neighbour.proc.poll() is not None


def test_neighbour_arguments():
    with pytest.raises(ValueError, match="kind"):
        Neighbour("spin")
    with pytest.raises(ValueError, match="nice"):
        Neighbour("busy", nice=20)


def test_joined_placements_pair_round_for_round():
    # two placements of the arrays: ours 2x the limit on the first, 1x on the second
    ours = timing.joined([timing.Timing([20.0, 22.0, 24.0], 1), timing.Timing([10.0, 11.0, 30.0], 4)])
    limit = timing.joined([timing.Timing([10.0, 11.0, 12.0], 1), timing.Timing([10.0, 11.0, 30.0], 4)])
    assert ours.samples == [20.0, 22.0, 24.0, 10.0, 11.0, 30.0]
    assert timing.paired_ratio(ours, limit) == 1.5
    assert timing.paired_ratio_quartiles(ours, limit) == (1.0, 2.0)
