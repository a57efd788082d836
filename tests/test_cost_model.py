"""The engine's cost model (lab.experiments.cost_model): the scheduler replay on cases worked by hand, a fit that
recovers known costs, and projections that stay within their bounds. Its accuracy against the real engine is
measured in notebook 15 (full profile) and recorded in docs/RESULTS.md."""

import numpy as np
import pandas as pd
import pytest

from lab.audit.projection import project
from lab.experiments import cost_model
from lab.experiments.cost_model import TERMS, CostModel, fit, schedule

LIMITS = {"max_num_batched_tokens": 4096, "max_num_seqs": 256}


def attention(start, tokens):
    return (tokens * start + tokens * (tokens + 1) / 2) / 1000


def test_one_request_prefills_in_a_step_then_decodes_one_token_a_step():
    plan = schedule([100], [0], [3], **LIMITS)
    assert plan.to_first_token[0].tolist() == [1, 1, 100, attention(0, 100)]
    assert plan.to_end.tolist() == pytest.approx([3, 3, 102, attention(0, 100) + attention(100, 1) + attention(101, 1)])


def test_cached_tokens_are_not_computed_but_are_attended_to():
    plan = schedule([100], [64], [1], **LIMITS)
    assert plan.to_end.tolist() == [1, 1, 36, attention(64, 36)]


def test_a_long_prompt_is_chunked_by_the_token_budget():
    plan = schedule([5000], [0], [1], max_num_batched_tokens=4096, max_num_seqs=256)
    assert plan.to_first_token[0][:3].tolist() == [2, 2, 5000]


def test_running_requests_go_first_and_max_num_seqs_makes_the_rest_wait():
    plan = schedule([10, 10, 10], [0, 0, 0], [2, 2, 2], max_num_batched_tokens=4096, max_num_seqs=2)
    steps_to_first = plan.to_first_token[:, 0].tolist()
    assert steps_to_first == [1, 1, 3], "the third starts when one of the first two has finished (after step 2)"
    budget = schedule([3000, 3000], [0, 0], [1, 1], max_num_batched_tokens=4096, max_num_seqs=256)
    assert budget.to_first_token[:, 0].tolist() == [1, 2], "the second's prefill is chunked behind the first's"


def synthetic_batch(shape, costs):
    """Rows as lab.experiments.measure.run_workload gives them, timed by a known cost model."""
    batch, tokens, cached, outputs = shape
    model = CostModel(dict(zip(TERMS, costs)), **LIMITS, fit_error=0)
    ttft, end = model.times([tokens] * batch, [cached] * batch, [outputs] * batch)
    return pd.DataFrame({"prompt_tokens": tokens, "cached_tokens": cached, "output_tokens": outputs, "ttft_s": ttft,
                         "arrival_s": 0.0, "e2e_s": end})


def test_the_fit_recovers_the_costs_that_timed_the_batches():
    costs = [0.003, 8e-5, 5e-5, 2e-5]
    batches = [synthetic_batch(shape, costs) for shape in cost_model.CALIBRATION]
    fitted = fit(batches, **LIMITS)
    assert [fitted.costs[t] for t in TERMS] == pytest.approx(costs, rel=1e-6)
    assert fitted.fit_error < 1e-6


def test_a_negative_cost_is_never_fitted():
    features = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    costs = cost_model._fit_non_negative(features, np.array([3.0, 2.0, 1.0]))  # falling with the second term
    assert (costs >= 0).all() and costs[1] == 0


def test_the_projection_lies_between_no_gain_and_the_naive_bound():
    model = CostModel({"fixed": 0.003, "per_sequence": 8e-5, "per_token": 5e-5, "per_attention": 2e-5}, **LIMITS,
                      fit_error=0.05)
    lengths = [1000] * 64
    nothing = project(model, lengths, [0] * 64)
    assert nothing.throughput_gain == pytest.approx(1) and nothing.ttft_change == pytest.approx(0)
    much = project(model, lengths, [960] * 64)
    assert 1 < much.throughput_gain < much.naive_bound == pytest.approx(1000 / 40)
    assert -1 < much.ttft_change < 0


def test_a_fit_is_saved_per_model_and_back_end_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(cost_model, "results_name", lambda model_path=None: "cost-model-test-cpu")
    model = CostModel({"fixed": 0.003, "per_sequence": 8e-5, "per_token": 5e-5, "per_attention": 2e-5}, **LIMITS,
                      fit_error=0.04)
    run_id = cost_model.save(model)
    loaded, meta = fit = cost_model.fitted()
    assert loaded == model and meta["run_id"] == run_id == fit.run_id and fit.device


def test_on_a_clock_a_lone_request_takes_its_prefill_step_and_a_queue_waits():
    costs = [0.003, 8e-5, 5e-5, 2e-5]
    alone = CostModel(dict(zip(TERMS, costs)), **LIMITS, fit_error=0).ttfts_with_arrivals([100, 100], [0, 0], [1, 1],
                                                                                          [0.0, 10.0])
    step = float(np.dot(costs, [1, 1, 100, attention(0, 100)]))
    assert alone.tolist() == pytest.approx([step, step])
    two_seats = CostModel(dict(zip(TERMS, costs)), max_num_batched_tokens=4096, max_num_seqs=2, fit_error=0)
    seats = two_seats.ttfts_with_arrivals([100] * 3, [0] * 3, [50] * 3, [0.0, 0.0, 0.0])
    assert seats[2] > 40 * costs[0], "the third waits for a seat: about fifty decode steps"


def test_the_projected_capacity_grows_with_the_cached_share():
    model = CostModel({"fixed": 0.003, "per_sequence": 8e-5, "per_token": 5e-5, "per_attention": 2e-5}, **LIMITS,
                      fit_error=0.05)
    lengths = [1000] * 200
    off = model.capacity(lengths, [0] * 200, 8, target_ms=300)
    on = model.capacity(lengths, [960] * 200, 8, target_ms=300)
    assert 0 < off < on and model.p99_ttft_ms(lengths, [0] * 200, 8, off) <= 300
