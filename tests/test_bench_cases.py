"""The bench's case builder: its check against posenc_fast.reference catches wrong results."""

import numpy as np
import pytest

from posenc_fast._bench import cases


def test_sample_rows_keeps_the_first_and_last_rows():
    rows = cases.sample_rows(1_000_000, 128)
    assert rows[0] == 0 and rows[-1] == 999_999
    assert np.all(np.diff(rows) > 0)
    assert len(rows) <= cases.SAMPLE_VALUES // 128
    assert np.array_equal(cases.sample_rows(100, 128), np.arange(100))


@pytest.mark.parametrize("key", ["w1_oop", "w4_cos_sin", "w5_sinusoidal_8192x1024", "alibi"])
def test_a_value_off_in_the_last_row_is_caught(key):
    case = cases.build_case(key, "float32", small=True)
    assert case.impl("posenc_fast").verify().ok
    results = tuple(case.parts.outputs)
    results[-1].reshape(-1, results[-1].shape[-1])[-1, 1] += 1e-3
    assert not case.check(results).ok


def test_a_wrong_offset_is_caught():
    import posenc_fast as pf

    case = cases.build_case("w3_token", "float64")
    x = case.parts.sources[0]
    rope = pf.RotaryEmbedding(cases.ROPE_DIM, base=cases.BASE, layout="half")
    assert case.check((rope.apply(x, offset=cases.W3_OFFSET),)).ok
    assert not case.check((rope.apply(x, offset=cases.W3_OFFSET - 1),)).ok

