"""lab.audit.timeline: the replay window by window, the hit rate of one cache and of the fleet beside the working set."""

import json

import numpy as np

from lab.audit import audit
from lab.audit.misses import Routes, attribute
from lab.audit.report import terminal_summary
from lab.audit.timeline import distinct_block_tokens, timeline, window_of


def test_windows_follow_the_clock_when_every_request_has_a_time():
    timed = window_of([0.0, 1.0, 2.0, 9.0, 10.0], windows=2)
    assert timed.unit == "seconds" and timed.window.tolist() == [0, 0, 0, 1, 1] and timed.starts.tolist() == [0.0, 5.0]
    untimed = window_of([None, 1.0, 2.0, 3.0], windows=2)
    assert untimed.unit == "requests" and untimed.window.tolist() == [0, 0, 1, 1] and untimed.starts.tolist() == [0.0, 2.0]


def test_a_working_set_past_the_capacity_shows_as_a_falling_hit_rate():
    """First a hot prefix shared by every request, then contexts that cycle through more than the cache holds."""
    block, kv_tokens = 4, 64
    hot = list(range(1000, 1032))  # 8 blocks
    shared = [hot + [i] for i in range(20)]
    cycling = [list(range(2000 + 100 * (i % 6), 2000 + 100 * (i % 6) + 32)) + [i] for i in range(20)]  # 6 x 8 blocks
    trace = shared + cycling
    one = attribute(trace, block_size=block, kv_tokens=kv_tokens).requests
    fleet = attribute(trace, block_size=block, kv_tokens=kv_tokens, routes=Routes([i % 2 for i in range(40)], 2))
    over_time = timeline([float(i) for i in range(40)], one, fleet.requests, distinct_block_tokens(trace, block),
                         kv_tokens=kv_tokens, windows=2)
    table = over_time.table
    assert over_time.unit == "seconds" and table.requests.tolist() == [20, 20]
    first, last = table.iloc[0], table.iloc[1]
    assert first.hit_rate > 0.8 and last.hit_rate == 0, "the cycling contexts are evicted before they return"
    assert first.working_set_tokens == 32 < kv_tokens < last.working_set_tokens == 6 * 32
    assert np.isclose(first.hit_rate * sum(map(len, shared)), one.cached_tokens[:20].sum())
    assert first.fleet_hit_rate < first.hit_rate, "two replicas each compute the hot prefix once"


def test_the_fleet_hit_rate_covers_the_requests_it_was_simulated_for():
    trace = [list(range(64)) + [i] for i in range(40)]
    one = attribute(trace, block_size=4, kv_tokens=1000).requests
    fleet = attribute(trace[:10], block_size=4, kv_tokens=1000, routes=Routes([i % 2 for i in range(10)], 2))
    over_time = timeline([None] * 40, one, fleet.requests, distinct_block_tokens(trace, 4), kv_tokens=1000,
                         windows=4)
    table = over_time.table
    assert over_time.unit == "requests" and table.requests.tolist() == [10] * 4
    assert table.fleet_hit_rate.notna().tolist() == [True, False, False, False]
    assert table.fleet_hit_rate[0] == fleet.hit_rate and table.working_set_tokens.tolist() == [64] * 4


def test_the_audit_replays_a_timestamped_log_over_time(tmp_path):
    lines = [{"prompt": f"System: you answer questions about order {i % 3}. " * 20 + f"Question {i}?",
              "timestamp": 1_764_579_600 + i} for i in range(30)]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in reversed(lines)))
    result = audit(log, kv_tokens=20_000, block_sizes=[32], replicas=2, progress=False)
    assert result.timeline_unit == "seconds" and result.timeline.requests.sum() == 30
    assert result.timeline.start.is_monotonic_increasing and result.timeline.hit_rate.iloc[-1] > 0
    assert "over time (" in terminal_summary(result)
