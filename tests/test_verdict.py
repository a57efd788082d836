"""A verdict follows its run's numbers: flip the numbers and the sentence flips, or says the run cannot tell."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.experiments.results import CANONICAL_DIR
from lab.experiments.verdict import Spread, Verdict, against_bound, outliers, rank, spreads, within_tolerance


def test_ranges_apart_give_an_order_and_flipping_the_numbers_flips_it():
    fast, slow = Spread("round_robin", (900, 950, 1000)), Spread("cache_aware", (1800, 1850, 1900))
    verdict = rank([fast, slow], quantity="p50 TTFT", unit="ms")
    assert verdict.order == ("round_robin", "cache_aware")
    assert "round_robin (900.0-1,000.0 ms) is lower than cache_aware" in str(verdict)
    flipped = rank([Spread("round_robin", slow.values), Spread("cache_aware", fast.values)], quantity="p50 TTFT")
    assert flipped.order == ("cache_aware", "round_robin")
    assert str(flipped) != str(verdict)


def test_overlapping_ranges_cannot_tell_and_say_which():
    verdict = rank([Spread("a", (1, 3)), Spread("b", (2, 4)), Spread("c", (10, 11))], quantity="TTFT")
    assert not verdict.can_tell
    assert "cannot tell a from b" in str(verdict)


def test_one_run_has_no_spread_so_it_cannot_tell():
    verdict = rank([Spread("a", (1,)), Spread("b", (100,))], quantity="TTFT")
    assert not verdict.can_tell and "one run" in str(verdict)
    assert not against_bound(Spread("gain", (9.0,)), 1.0, quantity="gain", bound_name="bound").can_tell
    assert not within_tolerance(Spread("gain", (4.3,)), 4.3, 0.15, quantity="gain", reference_name="it").can_tell


def test_higher_is_better_orders_the_other_way():
    assert rank([Spread("a", (1, 2)), Spread("b", (5, 6))], quantity="hit rate", lower_is_better=False).order == ("b", "a")


def test_a_bound_is_judged_on_every_repeat():
    assert against_bound(Spread("gain", (1.02, 1.05)), 1.0, quantity="gain", bound_name="bound").order == ("above",)
    assert against_bound(Spread("gain", (0.9, 0.95)), 1.0, quantity="gain", bound_name="bound").order == ("below",)
    straddles = against_bound(Spread("gain", (0.98, 1.03)), 1.0, quantity="gain", bound_name="bound")
    assert not straddles.can_tell and "cannot tell" in str(straddles)


@pytest.mark.parametrize("values, expected", [((1.1, 1.15), ("below",)), ((1.5, 1.6), ("above",)),
                                              ((1.25, 1.3), None), ((1.1, 1.3), None), ((1.3, 1.5), None)])
def test_a_bound_known_only_within_a_range_is_passed_only_beyond_its_far_end(values, expected):
    """Below only if below the range's low end in every repeat, above only if above its high end: a repeat between
    the ends (a value the bound may take) cannot be told from the bound."""
    verdict = against_bound(Spread("ratio", values), (1.2, 1.4), quantity="ratio", bound_name="the bound", unit="x")
    assert verdict.order == expected
    assert "against the bound 1.20-1.40 x" in str(verdict)
    with pytest.raises(ValueError, match="low first"):
        against_bound(Spread("ratio", values), (1.4, 1.2), quantity="ratio", bound_name="the bound")


def test_a_verdict_names_what_its_values_are_over():
    prompts = pd.DataFrame({"kind": ["local"] * 3 + ["cold"] * 3, "ttft_ms": [17, 19, 22, 81, 82, 83]})
    assert "over 3 prompts" in str(rank(spreads(prompts, "kind", "ttft_ms", each="prompt"), quantity="TTFT"))
    assert "over 3 repeats" in str(rank(spreads(prompts, "kind", "ttft_ms"), quantity="TTFT"))
    pairs = Spread("gain", (1.02, 1.05), each="pair")
    assert "above it in every pair" in str(against_bound(pairs, 1.0, quantity="gain", bound_name="bound"))
    assert "some pairs are and some are not" in str(within_tolerance(Spread("gain", (4.0, 5.5), each="pair"), 4.3,
                                                                     0.15, quantity="gain", reference_name="it"))


@pytest.mark.parametrize("values, expected", [((4.2, 4.5), ("within",)), ((6.0, 7.0), ("outside",)),
                                              ((4.66, 6.70), None), ((3.30, 11.86), None)])
def test_within_tolerance_of_a_projection(values, expected):
    verdict = within_tolerance(Spread("measured", values), 4.30, 0.15, quantity="gain", reference_name="the projection")
    assert verdict.order == expected
    if expected is None:
        assert "cannot tell whether the projection is within 15%" in str(verdict)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no finite value"):
        Spread("empty", ())
    with pytest.raises(ValueError, match="two or more"):
        rank([Spread("a", (1, 2))], quantity="TTFT")
    with pytest.raises(ValueError, match="tolerance"):
        within_tolerance(Spread("a", (1, 2)), 1, 0, quantity="x", reference_name="y")


def test_outliers_are_values_far_from_the_median():
    assert outliers(Spread("rag at 128", (8.0, 8.5, 32.6))) == [32.6]
    assert outliers(Spread("steady", (8.0, 8.5, 9.0))) == []


@given(st.lists(st.floats(0.1, 1e4), min_size=2, max_size=6), st.lists(st.floats(0.1, 1e4), min_size=2, max_size=6))
def test_an_order_is_given_only_when_the_ranges_are_apart(a, b):
    verdict = rank([Spread("a", a), Spread("b", b)], quantity="TTFT")
    assert verdict.can_tell == (max(a) < min(b) or max(b) < min(a))
    if verdict.can_tell:
        assert verdict.order == (("a", "b") if max(a) < min(b) else ("b", "a"))


def test_a_canonical_results_table_with_its_labels_swapped_changes_the_verdict():
    """On a real results table (16's gain per shared fraction, a row each): swap two rows' labels, the order swaps."""
    table = pd.read_csv(next(CANONICAL_DIR.glob("16_gain_vs_hit_rate-gain-*.csv")))
    table = table.assign(label=table.shared_fraction.astype(str))
    two = table.sort_values("throughput_gain").iloc[[0, -1]]
    as_run = rank(spreads(pd.concat([two, two]), "label", "throughput_gain"), quantity="gain", lower_is_better=False)
    swapped = two.assign(label=two.label.tolist()[::-1])
    flipped = rank(spreads(pd.concat([swapped, swapped]), "label", "throughput_gain"), quantity="gain",
                   lower_is_better=False)
    assert as_run.order == tuple(flipped.order[::-1])
    assert json.dumps(str(as_run)) != json.dumps(str(flipped))


# timing_check: the full profile's timing checks, a one-sided t-test at a stated false-alarm rate


def test_a_timing_check_passes_on_the_claimed_side_and_raises_the_alarm_well_beyond_it():
    from lab.experiments.verdict import timing_check

    below = timing_check([3.1, 3.2, 3.15], "at_most", 3.78, quantity="gain", bound_name="the bound")
    assert not below.alarm and "passes" in below.text and "false-alarm rate 0.05%" in below.text
    above = timing_check([5.0, 5.1, 5.05, 4.95], "at_most", 3.78, quantity="gain", bound_name="the bound")
    assert above.alarm and "ALARM" in above.text
    assert timing_check([1.5, 1.52, 1.49, 1.51], "at_least", 2, quantity="speed-up", bound_name="2x").alarm
    assert not timing_check([4.1, 3.9, 4.3], "at_least", 2, quantity="speed-up", bound_name="2x").alarm


def test_a_point_on_its_bound_raises_the_alarm_at_the_stated_rate():
    """h = 0: the true gain sits on its bound 1 / (1 - h) = 1; with normal noise between pairs, a 1% check alarms
    in about 1% of runs (20,000 simulated runs of 3 pairs, a fixed seed: 200 expected)."""
    from lab.experiments.verdict import TTest, timing_check

    rng = np.random.default_rng(0)
    alarms = sum(timing_check(np.exp(rng.normal(0, 0.05, 3)), "at_most", 1.0, quantity="gain", bound_name="bound",
                              test=TTest(false_alarm_rate=0.01)).alarm for _ in range(20_000))
    assert 150 <= alarms <= 250, alarms


def test_noise_groups_are_pooled_each_about_its_own_mean():
    from lab.experiments.verdict import TTest, timing_check

    # the same spread at very different levels (the other points of a sweep) narrows the margin: more freedom
    alone = timing_check([1.02, 0.98, 1.0], "at_most", 1.0, quantity="gain at 0%", bound_name="the bound")
    pooled = timing_check([1.02, 0.98, 1.0], "at_most", 1.0, quantity="gain at 0%", bound_name="the bound",
                          test=TTest(noise=[[2.04, 1.96, 2.0], [7.14, 6.86, 7.0]]))
    assert "df 2" in alone.text and "df 6" in pooled.text and "6 more for the noise" in pooled.text
    edge = lambda check: float(check.text.split("alarm only above ")[1].split(":")[0])  # noqa: E731
    assert 1 < edge(pooled) < edge(alone)


def test_a_timing_check_rejects_what_it_cannot_judge():
    from lab.experiments.verdict import TTest, timing_check

    with pytest.raises(ValueError, match="claim='above'"):
        timing_check([1.0, 1.1], "above", 1.0, quantity="q", bound_name="b")
    with pytest.raises(ValueError, match="two or more paired repeats"):
        timing_check([1.0], "at_most", 1.0, quantity="q", bound_name="b")
    with pytest.raises(ValueError, match="all positive"):
        timing_check([1.0, 0.0], "at_most", 1.0, quantity="q", bound_name="b")
    with pytest.raises(ValueError, match="false_alarm_rate=0.7"):
        TTest(false_alarm_rate=0.7)
    # one pair is judged by the noise of other pairs
    assert not timing_check([1.0], "at_most", 1.0, quantity="q", bound_name="b", test=TTest(noise=[[2.0, 2.1]])).alarm


def test_a_band_alarms_on_the_side_the_ratios_lie_beyond_at_half_the_rate_each():
    from lab.experiments.verdict import TTest, timing_band

    inside = timing_band([1.0, 1.02, 0.98], 0.85, 1.15, quantity="measured / projected", bound_name="15%")
    assert not any(c.alarm for c in inside) and all("false-alarm rate 0.025%" in c.text for c in inside)
    low, high = timing_band([0.5, 0.502, 0.499, 0.501, 0.498, 0.5], 0.85, 1.15, quantity="q", bound_name="15%")
    assert low.alarm and not high.alarm, "below the band: the 'at least low' check alarms"
    low, high = timing_band([1.5, 1.502, 1.499, 1.501, 1.498, 1.5], 0.99, 0.99, quantity="q", bound_name="1%",
                            test=TTest(false_alarm_rate=0.01))
    assert high.alarm and not low.alarm and "rate 0.5%" in high.text, "one value: which side of it"
    with pytest.raises(ValueError, match="in order"):
        timing_band([1.0, 1.1], 1.15, 0.85, quantity="q", bound_name="b")


def test_all_of_holds_only_where_every_verdict_shows_the_claim():
    from lab.experiments.verdict import all_of

    below, above, unsure = Verdict("a", ("below",)), Verdict("b", ("above",)), Verdict("c", None)
    assert all_of([below, below], "below").order == ("below",)
    assert all_of([below, above], "below").order == ("above",), "one shows the other side: that side"
    assert all_of([below, unsure], "below").order is None, "one cannot tell: nor can all"
    nothing = all_of([], "below", none="no ratio")
    assert nothing.order is None and nothing.text == "no ratio"


def test_no_alarm_with_the_mean_beyond_the_claim_says_it_is_not_shown():
    from lab.experiments.findings import CANNOT_TELL, from_check
    from lab.experiments.verdict import timing_check

    check = timing_check([0.99, 1.10, 1.06], "at_most", 1.0, quantity="gain at 0%", bound_name="the bound")
    assert not check.alarm and check.beyond and "mean itself lies above 1, so at most it is not shown" in check.text
    assert from_check(check, "g", "At most?").verdict == CANNOT_TELL
    inside = timing_check([0.95, 0.99, 0.97], "at_most", 1.0, quantity="gain", bound_name="the bound")
    assert not inside.beyond and "passes" in inside.text
