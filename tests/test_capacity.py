"""lab.experiments.capacity: controlled shared-fraction prompts, the bound, the inversion, the A100 projection, capacity,
the interval; and the gain curve on the real engine."""

import math

import pandas as pd
import pytest

from lab.core.model import tokenizer_for
from lab.core.prefix_cache import PrefixCache
from lab.experiments.a100 import a100_curve
from lab.experiments.capacity import capacity, ratio_interval, spread_name
from lab.experiments.gains import amdahl_bound, hit_rate_for, zero_hit_runs
from lab.experiments.generators import shared_fraction_prompts

BLOCK = 32


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.9])
def test_prompts_have_one_length_and_the_shared_share_asked_for(fraction):
    prompts = shared_fraction_prompts(tokenizer_for(None), 10, fraction, 512)
    assert {len(p) for p in prompts} == {512}
    shared = round(fraction * 512)
    assert all(p[:shared] == prompts[0][:shared] for p in prompts)
    assert len({tuple(p[shared:shared + 8]) for p in prompts}) == 10, "the rest is each prompt's own"
    cache = PrefixCache(num_blocks=1000, block_size=BLOCK)
    for i, p in enumerate(prompts):
        cache.allocate(str(i), p)
        cache.free(str(i))
    expected = 9 / 10 * (shared // BLOCK * BLOCK) / 512  # the first prompt finds nothing
    assert cache.stats.hit_rate == pytest.approx(expected, abs=BLOCK / 512)


def test_bad_fractions_and_sizes_are_named():
    with pytest.raises(ValueError, match=r"fraction=1.0 must be a number in \[0, 1\)"):
        shared_fraction_prompts(tokenizer_for(None), 4, 1.0, 128)
    with pytest.raises(ValueError, match="count=0"):
        shared_fraction_prompts(tokenizer_for(None), 0, 0.5, 128)
    with pytest.raises(ValueError, match="prompt_tokens=1"):
        shared_fraction_prompts(tokenizer_for(None), 4, 0.5, 1)
    with pytest.raises(ValueError, match="hit_rate=-0.1"):
        amdahl_bound(-0.1)


def test_bound_and_inversion():
    assert amdahl_bound(0.0) == 1 and amdahl_bound(0.75) == pytest.approx(4.0)
    table = pd.DataFrame({"hit_rate": [0.0, 0.5, 0.8], "throughput_gain": [1.0, 1.5, 3.0]})
    assert hit_rate_for(table, "throughput_gain", 2.25) == pytest.approx(0.65)
    assert math.isnan(hit_rate_for(table, "throughput_gain", 5.0)), "no extrapolation past what was measured"


def test_a100_projection_gains_follow_the_hit_rate():
    curve = a100_curve([2000] * 100, [16] * 100, [0.0, 0.5, 0.9])
    assert curve.throughput_gain.iloc[0] == pytest.approx(1.0)
    assert curve.throughput_gain.is_monotonic_increasing
    assert curve.throughput_gain.iloc[2] < amdahl_bound(0.9), "decode keeps the projection under the bound"
    assert curve.ttft_change.iloc[2] == pytest.approx(1 / curve.throughput_gain.iloc[2] - 1)


def test_capacity_is_the_highest_rate_before_the_first_miss():
    sweep = pd.DataFrame({"request_rate": [2, 4, 8, 16], "p99_ttft_ms": [50, 80, 400, 90]})
    assert capacity(sweep, 100) == 4, "16 passes again but comes after a miss"
    assert capacity(sweep, 10) == 0.0
    with pytest.raises(ValueError, match="target_ms=0"):
        capacity(sweep, 0)


def test_interval_brackets_the_mean_and_narrows_with_agreement():
    agreeing = [0.98, 1.0, 1.02, 0.99, 1.01] * 2
    mean, low, high = ratio_interval(agreeing)
    assert low < mean < high and mean == pytest.approx(1.0) and high - low < 0.02 < max(agreeing) - min(agreeing)
    wide = ratio_interval([0.7, 1.3, 0.8, 1.2] * 3)
    assert wide[2] - wide[1] > high - low
    assert spread_name(10) == "95% bootstrap interval of 10"
    with pytest.raises(ValueError, match="at least two"):
        ratio_interval([1.0])


def test_too_few_ratios_for_a_bootstrap_give_their_range():
    assert ratio_interval([0.96, 1.01]) == (pytest.approx(0.985), 0.96, 1.01)
    assert spread_name(2) == "range of 2"


def test_a_zero_hit_interval_needs_two_pairs():
    """(The runs themselves, alternating off/on and sharing nothing, are checked in notebooks/17_capacity.ipynb.)"""
    from lab.core.model import ensure_model

    prompts = shared_fraction_prompts(tokenizer_for(None), 4, 0.0, 256)
    with pytest.raises(ValueError, match="pairs=1"):
        zero_hit_runs(str(ensure_model()), prompts, pairs=1, block_size=BLOCK, max_tokens=2)


def test_the_rate_search_finds_a_threshold_from_any_bracket():
    """One search for the engine's capacity and the cost model's: the highest rate that meets, to within the
    tolerance, whether the bracket starts below, around or above it; 0 when nothing above the floor meets."""
    from lab.experiments.capacity import highest_rate_meeting

    for low, high in ((0.5, 1.0), (2.0, 64.0), (100.0, 200.0)):
        found = highest_rate_meeting(lambda rate: rate <= 7.3, low=low, high=high, tolerance=0.05, floor=0.01)
        assert 7.3 / 1.05 <= found <= 7.3
    assert highest_rate_meeting(lambda rate: False, low=1.0, high=2.0, tolerance=0.05, floor=0.01) == 0.0


def test_the_fastest_runs_make_the_table_and_each_repeat_keeps_its_own_gain():
    from lab.experiments.gains import fastest_gain, repeat_gains

    runs = pd.DataFrame([{"workload": "w", "repeat": r, "reuse": reuse, "requests_per_s": rps, "mean_ttft_ms": ttft,
                          "hit_rate": 0.75 if reuse else 0.0}
                         for r, reuse, rps, ttft in [(0, False, 10.0, 400.0), (0, True, 30.0, 100.0),
                                                     (1, True, 36.0, 90.0), (1, False, 9.0, 420.0)]])
    best = fastest_gain(runs).iloc[0]
    assert best.throughput_gain == pytest.approx(3.6) and best.ttft_change == pytest.approx(90 / 400 - 1)
    assert repeat_gains(runs).throughput_gain.tolist() == pytest.approx([3.0, 4.0])


def test_a_prefill_only_run_gives_the_prefill_share_and_stays_out_of_the_gains():
    from lab.experiments.gains import fastest_gain, gain_at_share, prefill_shares, repeat_gains

    runs = pd.DataFrame([{"workload": "w", "repeat": r, "reuse": reuse, "prefill_only": only, "requests_per_s": rps,
                          "mean_ttft_ms": 100.0, "hit_rate": 0.75 if reuse else 0.0}
                         for r, reuse, only, rps in [(0, False, False, 10.0), (0, True, False, 30.0), (0, False, True, 12.5),
                                                     (1, False, True, 10.0), (1, True, False, 36.0), (1, False, False, 9.0)]])
    assert prefill_shares(runs).prefill_share.tolist() == pytest.approx([0.8, 0.9])
    assert repeat_gains(runs).throughput_gain.tolist() == pytest.approx([3.0, 4.0])
    assert fastest_gain(runs).iloc[0].throughput_gain == pytest.approx(3.6)
    assert gain_at_share(1.0, 0.75) == pytest.approx(4.0)  # all the work prefill: the bound 1 / (1 - h)
    assert gain_at_share(0.9, 0.75) == pytest.approx(1 / (0.1 + 0.9 * 0.25))
    with pytest.raises(ValueError, match="prefill_share"):
        gain_at_share(1.2, 0.75)
