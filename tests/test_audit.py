"""lab.audit: a workload whose answer is known by construction, the report's numbers against direct
replays, the real engine's confirmation, and every bad input's message."""

import html
import json
import random

import pytest

from lab.audit import audit
from lab.audit.__main__ import main
from lab.audit.fields import move_line_to_end, value_kind
from lab.audit.prompts import AuditInputError, load_tokenizer, read_prompts
from lab.audit.replay import replay_hit_rate
from lab.audit.report import write_report
from lab.experiments.generators import text_of_tokens

SHARED = text_of_tokens(random.Random(1), 400, "policy")


def timestamped(i: int) -> str:
    """A template with a timestamp in front of a long shared part: nothing is shared until it moves."""
    question = text_of_tokens(random.Random(100 + i), 12, "all")
    return f"Current time: 2026-11-30 09:{i // 60:02d}:{i % 60:02d}\nYou are a support assistant.\n{SHARED}\nQuestion: {question}"


@pytest.fixture(scope="module")
def timestamp_audit(tmp_path_factory, write_jsonl):
    path = write_jsonl(tmp_path_factory.mktemp("audit") / "timestamped.jsonl",
                       [{"prompt": timestamped(i), "tenant": f"t{i % 3}"} for i in range(60)])
    return audit(path, replicas=2, kv_tokens=40_000, progress=False)


def test_a_leading_timestamp_is_named_and_moving_it_is_measured(timestamp_audit, tok):
    result = timestamp_audit
    field = result.fields[0]
    assert field.label == "Current time:" and field.kind == "timestamp" and field.prompts == 60
    assert field.median_token_position < 0.1 * result.prompt_tokens.mean, "the divergence is at the front"
    assert result.hit_rate_by_block_size[result.recommended_block_size] < 0.05, "as written, nothing is shared"
    moved = [f"You are a support assistant.\n{SHARED}\nQuestion: " + timestamped(i).split("Question: ")[1]
             + "\n" + timestamped(i).split("\n")[0] for i in range(60)]
    assert moved[0] == move_line_to_end(timestamped(0), "Current time:")
    replayed = replay_hit_rate(tok(moved)["input_ids"], result.recommended_block_size, 40_000)
    assert field.hit_rate_after == replayed > 0.8, "the rewritten hit rate is a replay of the rewritten prompts"


def test_the_summary_hit_rates_are_prefix_cache_replays(timestamp_audit, tok, tmp_path):
    result = timestamp_audit
    prompts = [timestamped(i) for i in range(60)]
    ids = tok(prompts)["input_ids"]
    assert result.hit_rate_by_block_size == {size: replay_hit_rate(ids, size, 40_000) for size in (32, 64, 128)}
    assert result.tenant_salt.tenants == 3 and result.tenant_salt.hit_rate_salted <= result.tenant_salt.hit_rate_shared
    assert result.cost_model_run.startswith("cost-model-") and result.confirmation is None
    assert result.projection.throughput_gain == pytest.approx(1) and result.projection.naive_bound == pytest.approx(1)
    assert set(result.fleet.policies.policy) >= {"round_robin", "consistent_hash"}
    assert result.fleet.recommended_policy in set(result.fleet.policies.policy)
    page, summary = write_report(timestamp_audit, tmp_path)
    text = page.read_text()
    assert "Current time:" in text and "<script src=\"http" not in text, "the page is self-contained"
    saved = json.loads(summary.read_text())
    assert saved["prompts"] == 60 and saved["fields"][0]["label"] == "Current time:"
    assert saved["hit_rate_by_block_size"] == {str(k): v for k, v in result.hit_rate_by_block_size.items()}
    assert write_report(timestamp_audit, tmp_path)[0] != page, "a second report never overwrites the first"


def test_prompts_that_share_their_start_have_no_field_to_move(tmp_path, write_jsonl):
    """(The real engine's confirmation is checked against the replay in notebooks/20_your_workload.ipynb.)"""
    rng = random.Random(0)
    path = write_jsonl(tmp_path / "shared.jsonl",
                       [{"prompt": f"{SHARED}\nQuestion {i}: {text_of_tokens(rng, 30, 'all')}"} for i in range(12)])
    result = audit(path, replicas=2, block_sizes=[32], progress=False)
    assert result.fields == [] and result.divergence.median_shared_fraction > 0.8
    assert result.confirmation is None and result.hit_rate_by_block_size[32] > 0.5


def test_values_are_named_by_what_they_look_like():
    assert [value_kind(v) for v in ("2026-11-30 09:00:01", "req-7f3a9c21e4", "42", "Alice", "how do I pay")] == \
        ["timestamp", "identifier", "number", "name", "text"]


def test_chat_records_use_the_chat_template(tmp_path, tok, write_jsonl):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "Where is my parcel?"}]}])
    prompts = read_prompts(path, tok, progress=False)
    rendered = tok.apply_chat_template([{"role": "user", "content": "Where is my parcel?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert prompts.texts == [rendered] and prompts.token_ids[0] == tok(rendered, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("lines, message", [
    ([], r"empty.jsonl: nothing to audit, it is empty"),
    (['{"prompt": "fine"}', "not json"], r"bad.jsonl:2: not JSON .*--skip-bad"),
    (['{"text": "no prompt here"}'], r"bad.jsonl:1: has neither 'prompt' nor 'messages'"),
    ([{"prompt": "word " * 6000}], r"bad.jsonl:1: \d+ tokens, longer than the model's context of 4096"),
    ([{"prompt": "hello", "arrival_s": "soon"}], r"bad.jsonl:1: 'arrival_s' must be a number"),
    ([{"token_ids": [1, "two"]}], r"bad.jsonl:1: 'token_ids' must be a non-empty list of token ids"),
    ([{"token_ids": list(range(5000))}], r"bad.jsonl:1: 5000 tokens, longer than the model's context"),
])
def test_bad_input_names_the_file_the_line_and_a_fix(tmp_path, tok, lines, message, write_jsonl):
    path = write_jsonl(tmp_path / ("empty.jsonl" if not lines else "bad.jsonl"), lines)
    with pytest.raises(AuditInputError, match=message):
        read_prompts(path, tok, progress=False)


def test_skip_bad_audits_the_good_lines_and_counts_the_rest(tmp_path, tok, write_jsonl):
    path = write_jsonl(tmp_path / "mixed.jsonl", ['{"prompt": "one"}', "oops", '{"nothing": 1}', '{"prompt": "two"}'])
    prompts = read_prompts(path, tok, skip_bad=True, progress=False)
    assert prompts.lines == [1, 4] and len(prompts.skipped) == 2 and "mixed.jsonl:2" in prompts.skipped[0]


def test_a_log_of_token_ids_is_audited_on_those_ids_never_encoded_again(tmp_path, tok, write_jsonl):
    shared = list(range(100, 420))  # ids whose decoding does not encode back to them one for one
    rows = [{"token_ids": shared + [500 + i] * 40, "tenant": f"t{i % 2}"} for i in range(12)]
    assert tok(tok.decode(rows[0]["token_ids"]))["input_ids"] != rows[0]["token_ids"], "the case this guards"
    path = write_jsonl(tmp_path / "ids.jsonl", rows)
    read = read_prompts(path, tok, progress=False)
    assert read.token_ids == [r["token_ids"] for r in rows] and all(read.ids_given)
    result = audit(path, kv_tokens=40_000, progress=False)
    assert (result.prompt_tokens.mean, result.prompt_tokens.max) == (360, 360)
    assert result.hit_rate_by_block_size[32] == replay_hit_rate([r["token_ids"] for r in rows], 32, 40_000)
    assert result.fields == [] and result.field_sample == 0 and result.breakers is None
    from lab.audit.report import terminal_summary

    assert "not searched (the log gives token ids" in terminal_summary(result)


def test_a_tokenizer_that_cannot_load_and_a_missing_file_are_named(tmp_path, capsys):
    with pytest.raises(AuditInputError, match=r"--model .*nowhere: cannot load a tokenizer .* leave --model out"):
        load_tokenizer(str(tmp_path / "nowhere"))
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err


def test_a_kv_capacity_smaller_than_a_prompt_is_refused(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": timestamped(0)}])
    with pytest.raises(AuditInputError, match=r"kv_tokens=500 cannot hold .*long.jsonl:1"):
        audit(path, kv_tokens=500, progress=False)


def test_every_prompt_token_is_cached_or_has_one_cause(timestamp_audit, tok):
    result = timestamp_audit
    tokens = result.misses.set_index("cause").tokens
    assert tokens.sum() == sum(len(ids) for ids in tok([timestamped(i) for i in range(60)])["input_ids"])
    assert tokens["other_prefix"] > 0.8 * tokens.sum(), "the shared part comes back behind each new timestamp"
    point = result.divergence_points.iloc[0]
    assert point.requests >= 50 and "Current time:" in point.excerpt and len(point.excerpt) < 120
    assert result.fleet_misses is not None and result.fleet_misses.tokens.sum() == tokens.sum()


def test_the_page_opens_with_the_verdict_and_the_summary_has_no_routes(timestamp_audit, tmp_path):
    page, summary = write_report(timestamp_audit, tmp_path)
    text = page.read_text()
    assert text.index("class='verdict'") < text.index("<h2>") and html.escape("Worth changing: move 'Current time:' (timestamp)") in text
    assert summary.name in text, "the page links its JSON instead of pasting it"
    assert "routes" not in json.loads(summary.read_text())["fleet"]


def test_a_line_that_is_not_utf8_is_named_with_its_byte(tmp_path, tok):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(AuditInputError, match=r"latin1.jsonl:2: not UTF-8 \(byte 16 of the line is b'\\xe9'\)"):
        read_prompts(path, tok, progress=False)


def test_a_long_divergence_label_is_shown_short():
    from lab.audit.report import short
    from lab.audit.what_ifs import excerpt

    assert len(short("x" * 3000)) == 41 and short("Current time:") == "Current time:"
    assert excerpt("a" * 100 + "\nB" + "c" * 100, 100, width=30) == "…" + "a" * 30 + "⟦⏎B" + "c" * 28 + "…"


def test_a_measured_gain_is_quoted_with_its_range_never_alone():
    from lab.audit.projection import Confirmation

    noisy = Confirmation(prompts=32, hit_rate=0.0, throughput_gain=0.97, gain_low=0.82, gain_high=1.08,
                         ttft_change=0.02, pairs=3, mean_ttft_ms_off=100.0, mean_ttft_ms_on=102.0)
    assert noisy.gain_text() == "x0.97, range x0.82-x1.08 over 3 pairs (no change this short a run can tell)"
    clear = Confirmation(prompts=32, hit_rate=0.8, throughput_gain=3.1, gain_low=2.9, gain_high=3.3,
                         ttft_change=-0.6, pairs=3, mean_ttft_ms_off=100.0, mean_ttft_ms_on=40.0)
    assert clear.gain_text() == "x3.10, range x2.90-x3.30 over 3 pairs"


def test_the_routing_advice_says_why():
    import pandas as pd

    from lab.audit.routing_advice import _reason, _recommend

    table = pd.DataFrame({"policy": ["random", "cache_aware", "consistent_hash"],
                          "fleet_hit_rate": [0.60, 0.602, 0.75], "imbalance": [1.1, 1.2, 2.4]})
    chosen = _recommend(table, 1.5)
    reason = _reason(table, chosen, 1.5)
    assert chosen == "cache_aware"
    assert "within x1.5 the mean load" in reason and "consistent_hash would keep more (75.0%)" in reason
    assert "random keep as many hits" in reason


def test_a_log_is_replayed_in_the_order_its_timestamps_give(tmp_path, tok, write_jsonl):
    """ISO 8601 or epoch seconds, in any order in the file: the replay follows the clock."""
    lines = [{"prompt": "third", "timestamp": "2026-12-01T09:00:03Z"},
             {"prompt": "first", "timestamp": 1_764_579_601},  # 2026-12-01T09:00:01Z
             {"prompt": "second", "timestamp": "2026-12-01T09:00:02+00:00"}]
    prompts = read_prompts(write_jsonl(tmp_path / "log.jsonl", lines), tok, progress=False)
    assert prompts.texts == ["first", "second", "third"] and prompts.lines == [2, 3, 1]
    with pytest.raises(AuditInputError, match=r"bad.jsonl:1: 'timestamp' 'yesterday' is neither ISO 8601"):
        read_prompts(write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "x", "timestamp": "yesterday"}]), tok,
                     progress=False)


def test_a_gzipped_log_reads_as_the_plain_one(tmp_path, tok, write_jsonl):
    import gzip

    lines = [{"prompt": "one"}, {"messages": [{"role": "user", "content": "two"}]}]
    plain = write_jsonl(tmp_path / "log.jsonl", lines)
    packed = tmp_path / "log.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_prompts(packed, tok, progress=False).token_ids == read_prompts(plain, tok, progress=False).token_ids


def test_a_parquet_log_reads_as_the_jsonl_one(tmp_path, tok, write_jsonl):
    """Rows as lines: prompts or chat messages (a list of structs), a timestamp column that orders them, tenants;
    a row with a bad field is named by its row number."""
    from datetime import UTC, datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [{"prompt": "second", "timestamp": "2026-12-01T09:00:02+00:00", "tenant": "b"},
             {"messages": [{"role": "user", "content": "first"}], "timestamp": "2026-12-01T09:00:01+00:00",
              "tenant": "a"}]
    jsonl = read_prompts(write_jsonl(tmp_path / "log.jsonl", lines), tok, progress=False)
    table = pa.table({"prompt": ["second", None],
                      "messages": [None, [{"role": "user", "content": "first"}]],
                      "timestamp": [datetime(2026, 12, 1, 9, 0, s, tzinfo=UTC) for s in (2, 1)],
                      "tenant": ["b", "a"]})
    pq.write_table(table, tmp_path / "log.parquet")
    parquet = read_prompts(tmp_path / "log.parquet", tok, progress=False)
    assert parquet.token_ids == jsonl.token_ids and parquet.tenants == jsonl.tenants == ["a", "b"]
    assert parquet.lines == jsonl.lines == [2, 1]
    pq.write_table(pa.table({"prompt": ["fine", "also fine"], "cache_salt": [None, ""]}), tmp_path / "bad.parquet")
    with pytest.raises(AuditInputError, match=r"bad.parquet: row 2: 'cache_salt' must be a non-empty string"):
        read_prompts(tmp_path / "bad.parquet", tok, progress=False)
    (tmp_path / "not.parquet").write_text("{}")
    with pytest.raises(AuditInputError, match=r"not.parquet: not a Parquet file"):
        read_prompts(tmp_path / "not.parquet", tok, progress=False)


def test_a_chats_tools_go_to_the_template_as_the_server_sends_them(tmp_path, tok, write_jsonl):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    prompts = read_prompts(write_jsonl(tmp_path / "tools.jsonl", [{"messages": messages, "tools": tools}]), tok,
                           progress=False)
    assert prompts.texts == [tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)]
    with pytest.raises(AuditInputError, match=r"bad.jsonl:1: 'tools' must be a list of tool definitions"):
        read_prompts(write_jsonl(tmp_path / "bad.jsonl", [{"messages": messages, "tools": "weather"}]), tok,
                     progress=False)
