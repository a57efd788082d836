"""`python -m lab.audit TRACE`: a block-hash trace is recognised and audited for what needs no text."""

import gzip
import json

import pytest

from lab import PROJECT_ROOT
from lab.audit.__main__ import main
from lab.audit.settings import AuditSettings
from lab.audit.trace_audit import NEEDS_TEXT, audit_trace

CONVERSATION = PROJECT_ROOT / "data" / "traces" / "mooncake_conversation_trace.jsonl.gz"


def bailian_log(path):
    """A Bailian-format file: two conversations of three turns, each turn's input its history plus new blocks."""
    records, next_id = [], 100
    for chat in range(2):
        history = [1, 2]  # a system prompt every conversation shares
        for turn in range(1, 4):
            history = history + [next_id, next_id + 1]
            next_id += 2
            records.append({"chat_id": chat * 10 + turn, "parent_chat_id": -1 if turn == 1 else chat * 10 + turn - 1,
                            "timestamp": chat * 0.5 + turn * 10.0, "input_length": len(history) * 16,
                            "output_length": 20, "hash_ids": history, "type": "text", "turn": turn})
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def test_a_bailian_file_through_the_command_line(tmp_path, capsys):
    assert main([str(bailian_log(tmp_path / "bailian.jsonl.gz")), "--kv-tokens", "10000", "--replicas", "2",
                 "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "a block-hash trace (bailian, 16-token blocks, no text): 6 requests" in printed
    assert "needs the prompts' text" in printed
    report = json.loads(next((tmp_path / "out").glob("audit-bailian-*.json")).read_text())
    assert report["kind"] == "block-hash trace" and report["needs_text"] == list(NEEDS_TEXT)
    # in arrival order (the conversations interleave): the first turn finds nothing, the other conversation's first
    # turn the shared system prompt; a later turn its history up to the previous turn's blocks
    cached = [0, 2, 4, 4, 6, 6]
    assert report["hit_rate"] == pytest.approx(sum(cached) / sum((4, 4, 6, 6, 8, 8)))


def test_a_flag_a_block_trace_ignores_is_named_and_one_it_reads_is_not(tmp_path, capsys):
    log = str(bailian_log(tmp_path / "bailian.jsonl.gz"))
    assert main([log, "--kv-tokens", "10000", "--replicas", "2", "--out", str(tmp_path / "a")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([log, "--block-sizes", "16", "--field-sample", "50", "--out", str(tmp_path / "b")]) == 0
    warned = capsys.readouterr().err
    assert "--block-sizes, --field-sample ignored" in warned and "--kv-tokens" in warned


def test_the_conversation_trace_reports_the_curve_windows_and_fleet():
    result = audit_trace(CONVERSATION, AuditSettings(kv_tokens=3_000_000, replicas=16, progress=False))
    assert result.requests == 12_031 and result.curve_requests == 12_031
    assert result.hit_rate < result.max_hit_rate / 2, "3M tokens reach under half the maximum (Mooncake, 5.3.1)"
    assert result.windows.requests.sum() == 12_031 and len(result.windows) == 12
    pooled = result.fleet.set_index("setup").hit_rate.iloc[-1]
    assert pooled >= result.fleet.hit_rate.max() - 1e-9, "no set of local caches beats one pool of all their tokens"


def test_a_bad_trace_line_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}) + "\n")
    assert main([str(bad)]) == 2
    assert "bad.jsonl:1: 1 hash_ids for input_length 2000" in capsys.readouterr().err


def test_the_scaled_trace_has_more_conversations_of_the_same_shape(tmp_path):
    from lab.audit.block_trace import read_block_trace
    from lab.audit.trace_bench import write_scaled

    path = tmp_path / "scaled.jsonl.gz"
    write_scaled(path, 24_100)
    scaled, original = read_block_trace(path), read_block_trace(CONVERSATION)
    assert len(scaled) == 24_100 and scaled.arrival_s[-1] <= original.arrival_s[-1] + 1
    assert scaled.total_blocks > 2 * original.total_blocks, "copies share no block"
    assert sorted(scaled.input_tokens[:1000].tolist()) != [] and set(scaled.input_tokens) <= set(original.input_tokens)
