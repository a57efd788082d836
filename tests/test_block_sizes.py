"""lab.experiments.block_sizes: the block size to use, ranked from the sweep's repeats, never typed ahead of the run."""

import pandas as pd

from lab.experiments.block_sizes import recommend_block_size, ttft_outliers, ttft_verdicts


def sweep(ttft: dict[int, list[float]], hit_rate: dict[int, float], workload: str = "w") -> pd.DataFrame:
    return pd.DataFrame([{"workload": workload, "block_size": size, "repeat": r, "vllm_hit_rate": hit_rate[size],
                          "mean_ttft_ms": value} for size, values in ttft.items() for r, value in enumerate(values)])


RATES = {32: 0.8, 64: 0.7, 128: 0.6}


def test_ranges_apart_name_the_fastest_and_flipping_the_numbers_flips_it():
    verdict = ttft_verdicts(sweep({32: [5.0, 5.1], 64: [6.0, 6.1], 128: [7.0, 7.2]}, RATES)).loc["w"]
    assert verdict.recommended == "32" and "32 (5.00-5.10 ms) is lower than 64" in verdict.ranking
    assert verdict.hit_rate_order.startswith("in each of the 3 pairs") and "also the one with the higher" in verdict.hit_rate_order
    flipped = ttft_verdicts(sweep({32: [7.0, 7.2], 64: [6.0, 6.1], 128: [5.0, 5.1]}, RATES)).loc["w"]
    assert flipped.recommended == "128" and "does not follow the hit rate alone" in flipped.hit_rate_order
    assert "128 is faster than 32 at hit rate 0.600 against 0.800" in flipped.hit_rate_order


def test_sizes_the_run_cannot_tell_from_the_fastest_give_the_largest_of_them():
    verdict = ttft_verdicts(sweep({32: [5.0, 5.4], 64: [5.2, 5.6], 128: [9.0, 9.1]}, RATES)).loc["w"]
    assert verdict.recommended == "32 or 64" and "cannot tell 32 or 64 apart" in verdict.why
    assert "cannot tell 32 from 64" in verdict.ranking


def test_one_run_of_each_cannot_tell():
    verdict = ttft_verdicts(sweep({32: [5.0], 64: [6.0], 128: [9.0]}, RATES)).loc["w"]
    assert pd.isna(verdict.recommended) and "cannot tell" in verdict.why and "cannot tell" in verdict.hit_rate_order
    assert "one run" in verdict.ranking


def test_a_run_far_from_its_workloads_median_is_flagged():
    runs = pd.concat([sweep({32: [5.0], 64: [6.0], 128: [30.0], 256: [7.0]}, RATES | {256: 0.5}, "rag"),
                      sweep({32: [5.0], 64: [6.0]}, RATES, "chat")])
    flagged = ttft_outliers(runs)
    assert flagged[["workload", "block_size"]].values.tolist() == [["rag", 128]]
    assert flagged.workload_median_ms.iloc[0] == 6.5
    assert ttft_outliers(runs[runs.mean_ttft_ms < 20]).empty


def test_the_one_recommendation_is_the_verdicts_size():
    runs = sweep({32: [10.0, 10.1], 64: [10.0, 11.2], 128: [12.0, 12.5]}, RATES)
    assert recommend_block_size(runs).to_dict() == {"w": "32 or 64"} == ttft_verdicts(runs).recommended.to_dict()


def test_a_size_the_run_shows_slower_is_never_recommended():
    """customer_service in a full run: 32 overlaps everyone, but 64's range lies below 256's: 256 is out."""
    from lab.experiments.block_sizes import recommend_from_spread
    from lab.experiments.verdict import Spread

    sizes = [Spread("32", (14.82, 20.0, 32.38)), Spread("64", (16.60, 18.0, 21.56)), Spread("128", (19.51, 25.0, 41.50)),
             Spread("256", (26.02, 27.0, 27.57))]
    size, why = recommend_from_spread(sizes)
    assert size == "32 or 64 or 128" and "256 shown slower than 64" in why and "32 shown" not in why


def test_a_lone_answer_at_the_smallest_size_swept_says_that_no_smaller_size_was_tried():
    from lab.experiments.block_sizes import recommend_from_spread
    from lab.experiments.verdict import Spread

    smallest = [Spread("64", (5.0, 5.1)), Spread("32", (3.0, 3.1)), Spread("128", (7.0, 7.2))]
    assert recommend_from_spread(smallest) == ("32", "32 (the smallest size swept: a smaller one was not tried): "
                                                     "its TTFT range lies below every other size's")
    middle = [Spread("32", (5.0, 5.1)), Spread("64", (3.0, 3.1)), Spread("128", (7.0, 7.2))]
    assert recommend_from_spread(middle) == ("64", "64: its TTFT range lies below every other size's")
