"""Block-hash traces: production request logs that carry reuse but no text (Mooncake's and Alibaba
Bailian's format).

Each line is one request: `timestamp`, `input_length`, `output_length` and `hash_ids`, one id per
block of the input, where the same id means the same prefix up to the end of that block, so an id is
already a chained hash. Mooncake's blocks are 512 tokens and its timestamps milliseconds; Bailian's
add `chat_id`, `parent_chat_id` (-1 for a conversation's first turn), `turn` and `type`, with
16-token blocks and timestamps in seconds. The partial last block has an id of its own, so
`len(hash_ids) == ceil(input_length / block_tokens)`.

The replay follows vLLM's rules through `lab.audit.replay.replay_chains`, the block pool proven
equal to `lab.core.prefix_cache.PrefixCache`: only full blocks are cached (the partial block's id is
dropped), the last token is always computed, requests arrive in timestamp order, each request's
blocks are freed tail first into the LRU free queue.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from lab.audit import cluster
from lab.audit.prompts import AuditInputError
from lab.audit.replay import replay_chains
from lab.core.block_hash import token_hit_rate

MOONCAKE = {"format": "mooncake", "block_tokens": 512, "seconds_per_tick": 1e-3}
BAILIAN = {"format": "bailian", "block_tokens": 16, "seconds_per_tick": 1.0}
REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")
BAILIAN_KEYS = ("chat_id", "parent_chat_id", "turn", "type")


@dataclass(frozen=True)
class BlockTrace:
    """A block-hash trace in arrival order: one entry per request, chains of full blocks only."""

    source: str
    format: str
    block_tokens: int
    arrival_s: np.ndarray  # seconds since the trace began
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    chains: tuple[
        np.ndarray, ...
    ]  # each request's full blocks' ids (the partial last block left out)
    conversations: pd.DataFrame | None = (
        None  # Bailian's chat_id, parent_chat_id, turn, type; None for Mooncake
    )

    def __len__(self) -> int:
        return len(self.chains)

    @cached_property
    def total_blocks(self) -> int:
        """Distinct full blocks in the trace: a pool this large never evicts."""
        return len(np.unique(np.concatenate(self.chains))) if len(self) else 0

    @cached_property
    def longest_request_blocks(self) -> int:
        return int(np.max(-(-self.input_tokens // self.block_tokens)))


def _open(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.suffix == ".gz"
        else open(path, encoding="utf-8")
    )


def is_block_trace(path: str | Path) -> bool:
    """Whether `path` (JSON lines, optionally gzipped; or shards of them, lab.audit.shards) holds a
    block-hash trace: its first record has `hash_ids`."""
    from lab.audit.shards import shard_paths

    try:
        path = shard_paths(path)[0]
    except AuditInputError:
        return False
    if not path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        return False
    with _open(path) as f:
        first = f.readline()
    try:
        return isinstance(json.loads(first), dict) and "hash_ids" in json.loads(first)
    except json.JSONDecodeError:
        return False


def _check_record(record: object, line: int, where: str, block_tokens: int) -> None:
    if not isinstance(record, dict):
        raise AuditInputError(f"{where}:{line}: expected a JSON object with {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise AuditInputError(
            f"{where}:{line}: missing {', '.join(missing)}; a block-hash trace line has "
            f"{', '.join(REQUIRED)}"
        )
    ids, length = record["hash_ids"], record["input_length"]
    if not (isinstance(length, int) and length > 0):
        raise AuditInputError(
            f"{where}:{line}: input_length={length!r} must be a positive whole number of tokens"
        )
    if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        raise AuditInputError(f"{where}:{line}: hash_ids must be a list of integer block ids")
    if len(ids) != math.ceil(length / block_tokens):
        raise AuditInputError(
            f"{where}:{line}: {len(ids)} hash_ids for input_length {length}: with "
            f"{block_tokens}-token blocks that needs {math.ceil(length / block_tokens)} "
            "(one per block, the partial last one included); is the block size right "
            "(block_tokens)?"
        )


def read_block_trace(
    path: str | Path, block_tokens: int | None = None, limit: int | None = None
) -> BlockTrace:
    """Read a Mooncake or Bailian trace (format told by its keys), check every line, sort by
    arrival. Each line is kept compactly (its full blocks' ids as an array), so a million requests
    fit in a few hundred MB. `block_tokens` overrides the format's block size; `limit` keeps the
    first requests of the file. `path` may name shards of one trace (a folder or a glob:
    lab.audit.shards), merged by arrival with their ids as they are."""
    from lab.audit.shards import shard_paths

    if not Path(path).is_file():
        if not Path(path).is_dir() and not any(ch in str(path) for ch in "*?["):
            raise AuditInputError(
                f"{path}: no such file; pass a block-hash trace (JSON lines with hash_ids), "
                "e.g. data/traces/mooncake_conversation_trace.jsonl.gz, or a folder of its shards"
            )
        shards = [read_block_trace(shard, block_tokens) for shard in shard_paths(path)]
        merged = _merge(shards, keep_ids_apart=False, source=str(path))
        return merged if limit is None else first_requests(merged, limit)
    path = Path(path)
    rows, chains, conversations, spec = [], [], [], None
    with _open(path) as f:
        for line, text in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise AuditInputError(f"{path}:{line}: not JSON ({error.msg})") from None
            spec = spec or (
                BAILIAN if isinstance(record, dict) and "chat_id" in record else MOONCAKE
            )
            size = block_tokens or spec["block_tokens"]
            _check_record(record, line, str(path), size)
            rows.append((record["timestamp"], record["input_length"], record["output_length"]))
            chains.append(
                np.asarray(record["hash_ids"][: record["input_length"] // size], dtype=np.int64)
            )
            if spec is BAILIAN:
                conversations.append(tuple(record.get(k) for k in BAILIAN_KEYS))
    if not rows:
        raise AuditInputError(f"{path}: no requests in the file")
    return _build(
        rows, chains, conversations, str(path), spec, block_tokens or spec["block_tokens"]
    )


def _build(
    rows: list[tuple],
    chains: list[np.ndarray],
    conversations: list[tuple],
    source: str,
    spec: dict,
    block_tokens: int,
) -> BlockTrace:
    table = np.asarray(rows, dtype=np.float64)
    order = np.argsort(table[:, 0], kind="stable")
    table = table[order]
    return BlockTrace(
        source=source,
        format=spec["format"],
        block_tokens=block_tokens,
        arrival_s=(table[:, 0] - table[0, 0]) * spec["seconds_per_tick"],
        input_tokens=table[:, 1].astype(np.int64),
        output_tokens=table[:, 2].astype(np.int64),
        chains=tuple(chains[i] for i in order),
        conversations=pd.DataFrame([conversations[i] for i in order], columns=list(BAILIAN_KEYS))
        if conversations
        else None,
    )


def combine(*traces: BlockTrace) -> BlockTrace:
    """Several traces as one (requests merged by arrival), their ids kept apart: two traces never
    share a block."""
    return _merge(traces, keep_ids_apart=True, source=" + ".join(t.source for t in traces))


def _merge(traces, *, keep_ids_apart: bool, source: str) -> BlockTrace:
    """Requests of several traces merged by arrival (stable: equal times keep their trace's order);
    the ids shifted per trace where the traces are unrelated, kept where they are shards of one."""
    if len({t.block_tokens for t in traces}) != 1:
        raise ValueError("traces of different block sizes cannot be replayed as one pool")
    offset, chains = 0, []
    for trace in traces:
        chains += (
            [chain + offset for chain in trace.chains] if keep_ids_apart else list(trace.chains)
        )
        offset += int(max((c.max() for c in trace.chains if len(c)), default=0)) + 1
    arrival = np.concatenate([t.arrival_s for t in traces])
    order = np.argsort(arrival, kind="stable")
    conversations = None
    if not keep_ids_apart and all(t.conversations is not None for t in traces):
        conversations = (
            pd.concat([t.conversations for t in traces], ignore_index=True)
            .iloc[order]
            .reset_index(drop=True)
        )
    return BlockTrace(
        source=source,
        format=traces[0].format,
        block_tokens=traces[0].block_tokens,
        arrival_s=arrival[order],
        input_tokens=np.concatenate([t.input_tokens for t in traces])[order],
        output_tokens=np.concatenate([t.output_tokens for t in traces])[order],
        chains=tuple(chains[i] for i in order),
        conversations=conversations,
    )


def first_requests(trace: BlockTrace, count: int) -> BlockTrace:
    """The first `count` requests in arrival order."""
    conversations = (
        None
        if trace.conversations is None
        else trace.conversations.iloc[:count].reset_index(drop=True)
    )
    return BlockTrace(
        source=trace.source,
        format=trace.format,
        block_tokens=trace.block_tokens,
        arrival_s=trace.arrival_s[:count],
        input_tokens=trace.input_tokens[:count],
        output_tokens=trace.output_tokens[:count],
        chains=trace.chains[:count],
        conversations=conversations,
    )


def pool_blocks(trace: BlockTrace, kv_tokens: int | None) -> int:
    """The blocks a pool of `kv_tokens` tokens holds for this trace (None: one that never evicts). A
    pool smaller than the longest request is raised to fit it, since an engine could not admit that
    request at all."""
    longest = trace.longest_request_blocks
    if kv_tokens is None:
        return trace.total_blocks + longest
    if kv_tokens < trace.block_tokens:
        raise ValueError(
            f"kv_tokens={kv_tokens} holds no {trace.block_tokens}-token block; give at least "
            f"{trace.block_tokens}"
        )
    blocks = max(kv_tokens // trace.block_tokens, longest)
    every_block = int(
        (trace.input_tokens // trace.block_tokens).sum()
    )  # at least the distinct ones: cheap to count
    return blocks if blocks <= every_block else min(blocks, trace.total_blocks + longest)


def cached_tokens(trace: BlockTrace, kv_tokens: int | None) -> np.ndarray:
    """Each request's cached tokens when the trace is replayed through one pool of `kv_tokens`
    tokens."""
    return replay_chains(
        trace.chains, trace.input_tokens, trace.block_tokens, pool_blocks(trace, kv_tokens)
    )


def hit_rate(trace: BlockTrace, kv_tokens: int | None) -> float:
    """The token hit rate (cached / input tokens) of the replay."""
    return token_hit_rate(cached_tokens(trace, kv_tokens), trace.input_tokens)


def capacity_curve(
    trace: BlockTrace, capacities: list[int] | np.ndarray, progress: bool = False
) -> pd.DataFrame:
    """The token hit rate at each KV capacity (tokens), and at infinite capacity (the trace's
    maximum). `pool_tokens` is the pool replayed: larger than `kv_tokens` where that could not hold
    the longest request (`raised_to_admit`: no engine of that capacity admits it, so that row is not
    a measurement of it). Each capacity is a Ray task on a cluster (lab.audit.cluster)."""
    capacities = [int(c) for c in capacities]
    rates = cluster.map_in_order(
        hit_rate, capacities, shared=(trace,), desc="capacities", progress=progress
    )
    rows = [
        {
            "kv_tokens": c,
            "pool_tokens": pool_blocks(trace, c) * trace.block_tokens,
            "hit_rate": rate,
        }
        for c, rate in zip(capacities, rates)
    ]
    rows = [row | {"raised_to_admit": row["pool_tokens"] > row["kv_tokens"]} for row in rows]
    maximum = hit_rate(trace, None)
    return pd.DataFrame(rows).assign(
        max_hit_rate=maximum, share_of_max=lambda t: t.hit_rate / maximum
    )


def tier_table(trace: BlockTrace, kv_tokens: int, tier_tokens: list[int]) -> pd.DataFrame:
    """The hit rate of a pool of `kv_tokens` with a second tier of each size in `tier_tokens` (0:
    none) behind it, replayed with vLLM's rules (lab.core.chain_pool): evicted blocks go to the
    tier, and a chain that misses in the pool goes on there. `from_tier`: the share of input tokens
    the tier served."""
    from lab.core.chain_pool import ChainPool

    rows = []
    for size in tier_tokens:
        pool = ChainPool(
            pool_blocks(trace, kv_tokens),
            trace.block_tokens,
            tier_blocks=int(size) // trace.block_tokens,
        )
        cached = [pool.serve(chain, int(n)) for chain, n in zip(trace.chains, trace.input_tokens)]
        rows.append(
            {
                "kv_tokens": kv_tokens,
                "tier_tokens": int(size),
                "hit_rate": token_hit_rate(cached, trace.input_tokens),
                "from_tier": pool.tier_hits * trace.block_tokens / int(trace.input_tokens.sum()),
            }
        )
    return pd.DataFrame(rows)
