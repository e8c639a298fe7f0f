"""N-shot sampling: N*C sentences, uniform, without replacement, not stratified."""

from __future__ import annotations

from collections import Counter

import pytest

from layerfusion_recipes.data.sampling import sample_shots


def test_size_is_shots_times_types_without_replacement():
    pool = list(range(100))
    sample = sample_shots(pool, shots=8, num_types=4, seed=0)
    assert len(sample) == 32 and len(set(sample)) == 32 and set(sample) <= set(pool)


def test_same_seed_same_sample_new_seed_new_sample():
    pool = list(range(100))
    assert sample_shots(pool, 4, 3, seed=5) == sample_shots(pool, 4, 3, seed=5)
    assert sample_shots(pool, 4, 3, seed=5) != sample_shots(pool, 4, 3, seed=6)


def test_capped_at_the_split():
    assert sorted(sample_shots(list(range(10)), 8, 4, seed=0)) == list(range(10))


def test_uniform_not_stratified():
    # 1 sentence in 50 holds the rare type: a stratified sampler would always include it,
    # a uniform one includes it with probability 10/50 = 0.2.
    pool = ["rare"] + [f"common{i}" for i in range(49)]
    hits = sum("rare" in sample_shots(pool, 5, 2, seed=s) for s in range(2000))
    assert 0.17 < hits / 2000 < 0.23
    counts = Counter(x for s in range(2000) for x in sample_shots(pool, 5, 2, seed=s))
    assert max(counts.values()) / min(counts.values()) < 1.35  # every sentence ~400 times


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="shots"):
        sample_shots([1, 2], 0, 3, seed=0)
