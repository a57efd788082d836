"""A slice of a block-hash trace on the real engine: `vllm bench serve --dataset-name timed_trace`
against a real `vllm serve`, scaled to fit a CPU, beside what the lab's replay predicts for the same
scaled slice and pool.

Scaling: each id stands for `tokens_per_id` tokens instead of 512 (the full blocks become engine
blocks of that size; the partial last block shrinks in proportion), outputs are cut to
`output_tokens`, and time is compressed by `sec_multiplier`. vLLM's client makes each id's tokens
from Python's `hash()` of the id, so equal ids give equal tokens within one process; it sends token
ids, so nothing is re-tokenised at the junctions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.audit.block_trace import MOONCAKE, BlockTrace, cached_tokens, read_block_trace
from lab.core.block_hash import token_hit_rate
from lab.experiments.results import write_atomically
from lab.experiments.serving_bench import Sent, bench_serve
from lab.serving.server import VLLMServer

SOURCE_BLOCK_TOKENS = MOONCAKE["block_tokens"]  # the tokens each id stands for in the source trace


def scaled_slice(
    source: str | Path,
    out: str | Path,
    *,
    requests: int,
    tokens_per_id: int,
    output_tokens: int,
    max_input_tokens: int,
) -> Path:
    """The first `requests` requests of `source` (a Mooncake-format trace) whose scaled input fits
    `max_input_tokens`, written as a timed-trace JSONL (timestamps as in the source, in its own
    unit)."""
    lines = []
    opener = __import__("gzip").open if str(source).endswith(".gz") else open
    with opener(source, "rt") as f:
        for text in f:
            record = json.loads(text)
            full, partial = divmod(record["input_length"], SOURCE_BLOCK_TOKENS)
            length = full * tokens_per_id + math.ceil(partial * tokens_per_id / SOURCE_BLOCK_TOKENS)
            if length + output_tokens > max_input_tokens:
                continue
            lines.append(
                json.dumps(
                    {
                        "timestamp": record["timestamp"],
                        "input_length": length,
                        "output_length": min(record["output_length"], output_tokens),
                        "hash_ids": record["hash_ids"],
                    }
                )
            )
            if len(lines) == requests:
                break
    if len(lines) < requests:
        raise ValueError(
            f"{source} has only {len(lines)} requests that fit {max_input_tokens} tokens scaled to "
            f"{tokens_per_id} per id; ask for fewer, or a smaller tokens_per_id"
        )
    write_atomically(Path(out), "\n".join(lines) + "\n")
    return Path(out)


@dataclass(frozen=True)
class EngineReplay:
    """The engine's token hit rate over a scaled slice, beside the lab's replay of the same slice
    and pool."""

    requests: int
    prompt_tokens: int
    engine_hit_rate: float
    predicted_hit_rate: float
    concurrency: str  # "one at a time" or "as timed"
    p50_ttft_ms: float


def predicted(
    path: str | Path, tokens_per_id: int, kv_blocks: int
) -> tuple[BlockTrace, np.ndarray]:
    """The lab's replay of the scaled slice through a pool of `kv_blocks` usable blocks (one request
    at a time)."""
    trace = read_block_trace(path, block_tokens=tokens_per_id)
    return trace, cached_tokens(trace, kv_blocks * tokens_per_id)


def server_pool(server: VLLMServer) -> tuple[int, int]:
    """The server's block size (the tokens each id of the slice stands for) and its usable KV
    blocks: the pool the prediction replays through."""
    blocks = server.engine_args.get("num_gpu_blocks_override")
    if server.block_size is None or blocks is None:
        raise ValueError(
            "engine_replay needs a server started with block_size=<tokens per id> and engine_args="
            "{'num_gpu_blocks_override': <usable blocks> + 1}: its prediction replays that pool"
        )
    return server.block_size, blocks - 1  # vLLM's null block takes one


def engine_replay(
    server: VLLMServer,
    path: str | Path,
    *,
    sec_multiplier: float,
    one_at_a_time: bool,
    seed: int = 0,
) -> EngineReplay:
    """The slice through the real server (its prefix cache emptied first) with vLLM's client, at the
    trace's arrival times scaled by `sec_multiplier`, or one request at a time; beside the lab's
    replay of the slice through a pool of the server's block size and usable blocks."""
    tokens_per_id, kv_blocks = server_pool(server)
    trace, cached = predicted(path, tokens_per_id, kv_blocks)
    server.reset_prefix_cache()
    extra = [
        "--timed-trace-chunk-hash-size",
        str(tokens_per_id),
        "--timed-trace-sec-multiplier",
        str(sec_multiplier),
    ]
    if one_at_a_time:
        extra += ["--max-concurrency", "1"]
    sent = Sent(
        dataset="timed_trace", dataset_path=Path(path), output_tokens=1, seed=seed, extra_args=extra
    )
    row = bench_serve(server, sent, request_rate=math.inf, num_prompts=len(trace))
    return EngineReplay(
        requests=len(trace),
        prompt_tokens=int(trace.input_tokens.sum()),
        engine_hit_rate=float(row["hit_rate"]),
        predicted_hit_rate=token_hit_rate(cached, trace.input_tokens),
        concurrency="one at a time" if one_at_a_time else "as timed",
        p50_ttft_ms=float(row["p50_ttft_ms"]),
    )
