"""BabyBear arithmetic and NTTs against naive Python-integer references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzkd.bundled import field
from cuzkd.bundled.ntt import NttPlan, naive_dft

elements = st.integers(min_value=0, max_value=field.P - 1)


def test_field_constants() -> None:
    assert field.P == 2013265921
    assert (field.P - 1) % (1 << field.TWO_ADICITY) == 0
    # 31 generates the multiplicative group: no maximal proper subgroup contains it.
    for q in (2, 3, 5):
        assert pow(field.GENERATOR, (field.P - 1) // q, field.P) != 1


@pytest.mark.parametrize("log_n", [0, 1, 5, 14, field.TWO_ADICITY])
def test_root_of_unity_has_exact_order(log_n: int) -> None:
    w = field.root_of_unity(log_n)
    assert pow(w, 1 << log_n, field.P) == 1
    if log_n:
        assert pow(w, 1 << (log_n - 1), field.P) != 1


def test_no_root_beyond_two_adicity() -> None:
    with pytest.raises(ValueError, match="2\\^28"):
        field.root_of_unity(field.TWO_ADICITY + 1)


@given(st.lists(st.tuples(elements, elements), min_size=1, max_size=64))
def test_vector_ops_match_python_integers(pairs: list[tuple[int, int]]) -> None:
    a = np.array([x for x, _ in pairs], dtype=np.uint64)
    b = np.array([y for _, y in pairs], dtype=np.uint64)
    assert field.mul(a, b, np).tolist() == [x * y % field.P for x, y in pairs]
    assert field.add(a, b, np).tolist() == [(x + y) % field.P for x, y in pairs]
    assert field.sub(a, b, np).tolist() == [(x - y) % field.P for x, y in pairs]


@given(elements, st.integers(min_value=1, max_value=100))
def test_powers(base: int, count: int) -> None:
    assert field.powers(base, count, np).tolist() == [
        pow(base, i, field.P) for i in range(count)]


def test_inverse() -> None:
    assert field.inv(7) * 7 % field.P == 1
    with pytest.raises(ZeroDivisionError):
        field.inv(field.P)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=6).flatmap(
    lambda k: st.lists(elements, min_size=1 << k, max_size=1 << k)))
def test_ntt_matches_naive_transform(values: list[int]) -> None:
    log_n = len(values).bit_length() - 1
    plan = NttPlan(log_n, np)
    coeffs = np.array(values, dtype=np.uint64)
    evals = plan.forward(coeffs)
    assert evals.tolist() == naive_dft(values, field.root_of_unity(log_n))
    assert plan.inverse(evals).tolist() == values


@settings(max_examples=20, deadline=None)
@given(st.lists(elements, min_size=16, max_size=16))
def test_coset_ntt_evaluates_on_shifted_domain(values: list[int]) -> None:
    plan = NttPlan(4, np)
    coeffs = np.array(values, dtype=np.uint64)
    w = field.root_of_unity(4)
    g = field.GENERATOR
    expected = [sum(c * pow(g * pow(w, i, field.P), j, field.P) for j, c in enumerate(values))
                % field.P for i in range(16)]
    assert plan.coset_forward(coeffs).tolist() == expected
    assert plan.coset_inverse(plan.coset_forward(coeffs)).tolist() == values


def test_batched_rows_transform_independently() -> None:
    plan = NttPlan(5, np)
    rng = np.random.default_rng(1)
    rows = rng.integers(0, field.P, size=(3, 32), dtype=np.uint64)
    batched = plan.forward(rows)
    for row, out in zip(rows, batched, strict=True):
        assert out.tolist() == plan.forward(row).tolist()


def test_wrong_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="expected length 8"):
        NttPlan(3, np).forward(np.zeros(4, dtype=np.uint64))


def test_table_bytes_count_built_tables() -> None:
    plan = NttPlan(6, np)
    assert plan.table_bytes == 0 and plan.coset_bytes == 0
    plan.coset_forward(np.zeros(64, dtype=np.uint64))
    assert plan.table_bytes == 64 * 8 + 32 * 8  # bitrev + forward twiddles
    assert plan.coset_bytes == 64 * 8
