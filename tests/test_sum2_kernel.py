"""The compiled Sum2 step of rounding.accumulate (streamdp/_sum2_kernel.py) is bit-identical to
the numpy blocks it replaces for long vectors: values and compensations, signed zeros, infinities
and NaNs, and the compensated sums' exactness over a long sequence."""
import numpy as np
import pytest

from streamdp.privacy import rounding


def _numpy_path(monkeypatch):
    monkeypatch.setattr(rounding, "_COMPILED_MIN", 1 << 62)


def _bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


@pytest.mark.parametrize("shape", [(5000,), (300, 40), (1 << 15,)])
def test_compiled_sum2_is_bit_identical(shape, monkeypatch):
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    mags = lambda: 10.0 ** rng.integers(-300, 300, n).reshape(shape)      # noqa: E731
    h0 = rng.standard_normal(shape) * mags()
    lo0 = rng.standard_normal(shape) * 1e-30
    xs = [rng.standard_normal(shape) * mags() for _ in range(3)]
    special = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.7976931348623157e308, -1.7976931348623157e308,
               5e-324, -5e-324, 1.0, 2.0**53, -(2.0**-1074)]
    flat = xs[0].reshape(-1)
    flat[:len(special)] = special
    h0.reshape(-1)[:len(special)] = special[::-1]
    assert n >= rounding._COMPILED_MIN
    got = (h0.copy(), lo0.copy())
    with np.errstate(all="ignore"):
        for x in xs:
            rounding.accumulate(*got, x)
        _numpy_path(monkeypatch)
        ref = (h0.copy(), lo0.copy())
        for x in xs:
            rounding.accumulate(*ref, x)
    np.testing.assert_array_equal(_bits(got[0]), _bits(ref[0]))
    np.testing.assert_array_equal(_bits(got[1]), _bits(ref[1]))


def test_compiled_sum2_is_exact_where_plain_summation_is_not():
    """1 + 1e-16 a million times: the compensated pair holds the exact total."""
    n = 1 << 13
    hi, lo = np.ones(n), np.zeros(n)
    x = np.full(n, 1e-16)
    for _ in range(1000):
        rounding.accumulate(hi, lo, x)
    assert np.all(hi == 1.0)                                # each addition alone rounds away
    np.testing.assert_allclose(hi + lo, 1.0 + 1000 * 1e-16, rtol=1e-15)
