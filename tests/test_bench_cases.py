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


@pytest.mark.parametrize("key", ["w1_oop", "w4_cos_sin", "w5_sinusoidal_8192x1024", "alibi",
                                 "position_table"])
def test_a_value_off_in_the_last_row_is_caught(key):
    case = cases.build_case(key, "float32", small=True)
    assert case.impl("posenc_fast").verify().ok
    case.reset()
    results = cases.as_tuple(case.impl("posenc_fast").run())
    assert case.check(results).ok
    results[-1].reshape(-1, results[-1].shape[-1])[-1, 1] += 1e-3
    assert not case.check(results).ok


@pytest.mark.parametrize("key", ["w1_oop", "w1_inplace", "w4_cos_sin", "position_table", "alibi_exact"])
def test_every_limit_checks_its_own_result(key):
    assert cases.build_case(key, "float32", small=True).impl("limit").verify() is None


def test_an_explicit_shape_overrides_the_workloads():
    case = cases.build_case("w1_oop", "float32", shape=(1, 32, 32, 128))
    assert case.shape == (1, 32, 32, 128) and case.parts.outputs[0].nbytes == 512 * 1024
    assert case.impl("posenc_fast").verify().ok


def test_a_wrong_offset_is_caught():
    import posenc_fast as pf

    case = cases.build_case("w3_token", "float64")
    x = case.parts.sources[0]
    rope = pf.RotaryEmbedding(cases.ROPE_DIM, base=cases.BASE, layout="half")
    assert case.check((rope.apply(x, offset=cases.W3_OFFSET),)).ok
    assert not case.check((rope.apply(x, offset=cases.W3_OFFSET - 1),)).ok



@pytest.mark.parametrize("key", ["w1_oop_interleaved", "w1_inplace_interleaved"])
def test_the_interleaved_rows_are_checked_against_the_interleaved_rotation(key):
    import posenc_fast as pf

    case = cases.build_case(key, "float32", small=True)
    assert case.impl("posenc_fast").verify().ok
    x = case.parts.sources[0]
    for layout, ok in (("interleaved", True), ("half", False)):
        rope = pf.RotaryEmbedding(x.shape[-1], base=cases.BASE, layout=layout)
        assert case.check((rope.apply(x),)).ok is ok
