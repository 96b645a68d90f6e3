"""scripts/numpy_attention.py's BigBird draws pinned to fixed values: tests/core/test_pattern.cpp
(PatternRule.BigBirdPicksAreDistinctSortedAndSeeded) pins the same values for the C++
bigbird_pick, so the two independent codes are held to draw the same key blocks."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from numpy_attention import bigbird_picks  # noqa: E402


@pytest.mark.parametrize("seed, random, qb, key_blocks, want", [
    (1, 3, 0, 64, [3, 30, 43]),
    (2, 3, 0, 64, [5, 12, 52]),
    (11, 3, 7, 5, [0, 2, 4]),
    (9, 2, 3, 4, [1, 3]),
    (1, 3, 0, 2, [0, 1]),
])
def test_bigbird_picks_fixed_values(seed, random, qb, key_blocks, want):
    assert sorted(bigbird_picks(seed, random, qb, key_blocks)) == want
