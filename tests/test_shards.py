"""A log in shards (a folder or a glob of JSONL, gzipped or not) is audited as the one file they were cut from."""

import gzip
import random

import pandas as pd
import pytest

from lab import PROJECT_ROOT
from lab.audit import audit
from lab.audit.prompts import AuditInputError
from lab.audit.shards import shard_paths
from lab.audit.trace_audit import audit_trace
from lab.experiments.generators import text_of_tokens

CONVERSATION = PROJECT_ROOT / "data" / "traces" / "mooncake_conversation_trace.jsonl.gz"
SHARED = text_of_tokens(random.Random(3), 300, "policy")


def records(count: int) -> list[dict]:
    """Prompts with arrival times (some equal), some sharing a long start: their order across shards matters."""
    rng = random.Random(5)
    return [{"prompt": (SHARED if i % 3 else "") + text_of_tokens(random.Random(i), 20, "all"),
             "arrival_s": float(rng.randrange(20)), "tenant": f"t{i % 2}"} for i in range(count)]


def cut(rows: list[dict], folder, write_jsonl, names=("a.jsonl", "b.jsonl.gz", "c.jsonl")):
    """The rows dealt round-robin over shards (so each shard's times interleave with the others'). As one log, the
    shards stand for their records end to end in name order (`lab.audit.shards`)."""
    folder.mkdir()
    for k, name in enumerate(names):
        write_jsonl(folder / name, rows[k::len(names)])
    return folder


def test_shards_audit_as_the_file_they_were_cut_from(tmp_path, write_jsonl):
    rows = records(45)
    in_shard_order = [row for k in range(3) for row in rows[k::3]]  # equal arrival times keep this order
    whole = audit(write_jsonl(tmp_path / "whole.jsonl", in_shard_order), replicas=2, kv_tokens=40_000, progress=False)
    folder = cut(rows, tmp_path / "shards", write_jsonl)
    for spec in (folder, str(folder / "*.jsonl*")):
        sharded = audit(spec, replicas=2, kv_tokens=40_000, progress=False)
        assert sharded.prompts == whole.prompts == 45
        assert sharded.hit_rate_by_block_size == whole.hit_rate_by_block_size
        assert sharded.radix_hit_rate == whole.radix_hit_rate
        pd.testing.assert_frame_equal(sharded.misses, whole.misses)


def test_a_bad_line_is_named_by_its_shard_and_line(tmp_path, write_jsonl):
    folder = cut(records(9), tmp_path / "shards", write_jsonl)
    with gzip.open(folder / "b.jsonl.gz", "at") as f:
        f.write("not json\n")
    with pytest.raises(AuditInputError, match=r"b\.jsonl\.gz:4: not JSON"):
        audit(folder, replicas=2, kv_tokens=40_000, progress=False)


def test_a_block_trace_in_shards_audits_as_one(tmp_path):
    lines = gzip.open(CONVERSATION, "rt").read().splitlines()[:3000]
    folder = tmp_path / "trace"
    folder.mkdir()
    for k in range(3):
        with gzip.open(folder / f"part-{k}.jsonl.gz", "wt") as f:
            f.write("\n".join(lines[k::3]) + "\n")
    whole_path = tmp_path / "whole.jsonl"  # the shards end to end, in name order: the log they stand for
    whole_path.write_text("".join("\n".join(lines[k::3]) + "\n" for k in range(3)))
    whole, sharded = audit_trace(whole_path), audit_trace(folder)
    assert sharded.requests == whole.requests == 3000
    assert sharded.hit_rate == whole.hit_rate and sharded.max_hit_rate == whole.max_hit_rate
    pd.testing.assert_frame_equal(sharded.curve, whole.curve)
    pd.testing.assert_frame_equal(sharded.fleet, whole.fleet)


def test_a_spec_that_names_no_log_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditInputError, match="a folder with no log files"):
        shard_paths(tmp_path / "empty")
    with pytest.raises(AuditInputError, match="no file matches the pattern"):
        shard_paths(str(tmp_path / "*.jsonl"))
    with pytest.raises(AuditInputError, match="no such file, folder or pattern"):
        shard_paths(tmp_path / "missing.jsonl")
