"""The audit's engine confirmation judges its projection only where its range can (issue 39, item 4): pure, no
engine."""

from types import SimpleNamespace

import pandas as pd

from lab.audit.projection import Confirmation, Projection, judge_projection


def confirmation(gains: tuple[float, ...], projected: float | None = 4.30) -> Confirmation:
    projection = Projection(hit_rate=0.8, throughput_gain=projected, ttft_change=-0.7, naive_bound=5.0, prompts=48,
                            output_tokens=8) if projected else None
    return Confirmation(prompts=48, hit_rate=0.8, throughput_gain=sorted(gains)[len(gains) // 2],
                        gain_low=min(gains), gain_high=max(gains), ttft_change=-0.7, pairs=len(gains),
                        mean_ttft_ms_off=100.0, mean_ttft_ms_on=30.0, projected=projection, gains=gains)


def test_a_range_too_wide_cannot_tell_and_gives_the_range():
    for gains in [(4.66, 5.20, 6.70), (3.30, 5.10, 11.86)]:  # the two runs around a projection of x4.30
        verdict = judge_projection(gains, 4.30)
        assert not verdict.can_tell and "cannot tell whether the projection (x4.30) is within 15%" in verdict.text
        assert f"x{min(gains):.2f}-x{max(gains):.2f} over 3 pairs" in verdict.text


def test_a_range_wider_than_1_3_cannot_tell_even_if_far_from_the_projection():
    verdict = judge_projection((8.0, 9.0, 10.8), 4.30)  # max/min 1.35, every pair outside the band
    assert not verdict.can_tell and "cannot tell" in verdict.text and "max/min 1.35" in verdict.text


def test_a_tight_range_straddling_the_band_cannot_tell():
    verdict = judge_projection((4.70, 4.90, 5.10), 4.30)  # the band is x3.66-x4.95
    assert not verdict.can_tell and "cannot tell whether the projection (x4.30) is within 15%" in verdict.text
    assert "x4.70-x5.10 over 3 pairs" in verdict.text


def test_a_tight_range_around_the_projection_is_within():
    verdict = judge_projection((4.10, 4.25, 4.60), 4.30)
    assert verdict.order == ("within",) and "cannot tell" not in verdict.text
    assert "(x4.30) is within 15% of the engine" in verdict.text and "every pair is within" in verdict.text


def test_a_tight_range_away_from_the_projection_is_not_within():
    verdict = judge_projection((6.00, 6.30, 6.80), 4.30)
    assert verdict.order == ("outside",) and "is not within 15%" in verdict.text
    assert "no pair is within" in verdict.text and "6.00-6.80" in verdict.text


def test_one_pair_or_no_projection_cannot_judge():
    assert "cannot tell" in judge_projection((4.3,), 4.30).text and not judge_projection((4.3,), 4.30).can_tell
    assert "no projection" in judge_projection((4.1, 4.3), None).text


def test_a_confirmation_judges_its_own_pairs_and_falls_back_on_its_range():
    assert confirmation((4.66, 5.20, 6.70)).judgement().can_tell is False
    assert confirmation((4.10, 4.25, 4.60)).judgement().order == ("within",)
    built_by_hand = Confirmation(prompts=32, hit_rate=0.8, throughput_gain=3.1, gain_low=2.9, gain_high=3.3,
                                 ttft_change=-0.6, pairs=3, mean_ttft_ms_off=100.0, mean_ttft_ms_on=40.0)
    assert "no projection" in built_by_hand.judgement().text


def test_the_report_verdict_says_it_in_so_many_words():
    from lab.audit.report import verdict

    def result(c: Confirmation):
        return SimpleNamespace(hit_rate_by_block_size={16: 0.8}, recommended_block_size=16, prompts=48,
                               kv_tokens=100_000, projection=c.projected, confirmation=c, fields=[], breakers=None,
                               what_ifs=pd.DataFrame(columns=["change", "hit_rate", "gain_points", "cause"]))

    wide = "\n".join(verdict(result(confirmation((3.30, 5.10, 11.86)))))
    assert "The engine run cannot tell whether the projection (x4.30) is within 15%" in wide
    assert "x3.30-x11.86 over 3 pairs" in wide
    tight = "\n".join(verdict(result(confirmation((4.10, 4.25, 4.60)))))
    assert "is within 15% of the engine" in tight and "cannot tell" not in tight
