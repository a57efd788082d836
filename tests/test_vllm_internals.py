"""lab.serving.vllm_internals against the running engine: each fact read from vLLM's structure agrees with what the
public API and the block arithmetic say."""

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from lab.core.prefix_cache import block_hashes
from lab.serving import vllm_internals
from lab.serving.engine import generate

BLOCK = 32


def test_blocks_in_use_count_shared_blocks_once_and_fall_back_to_zero(llm):
    llm.reset_prefix_cache()
    assert vllm_internals.kv_blocks_in_use(llm) == 0
    assert 0 < vllm_internals.num_kv_blocks(llm) == vllm_internals.block_pool(llm).num_gpu_blocks - 1
    shared = list(range(100, 100 + 4 * BLOCK))
    engine = vllm_internals.engine_loop(llm)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("a", TokensPrompt(prompt_token_ids=shared + [7] * 10), params)
    engine.step()
    engine.add_request("b", TokensPrompt(prompt_token_ids=shared + [8] * 10), params)
    engine.step()
    # a: 4 shared full blocks + 1 partial; b hits the 4 shared ones and adds its own partial block.
    assert vllm_internals.kv_blocks_in_use(llm) == 4 + 1 + 1
    shared_counts = [block.ref_cnt for block in vllm_internals.block_pool(llm).blocks if block.ref_cnt > 1]
    assert shared_counts == [2] * 4, "the four shared blocks are held by both requests"
    assert vllm_internals.ref_counts(llm) == {1: 2, 2: 4}, "each request's own partial block, the shared four"
    while engine.has_unfinished_requests():
        engine.step()
    assert vllm_internals.kv_blocks_in_use(llm) == 0, "finished requests hold no blocks (theirs stay cached)"
    assert vllm_internals.cached_free_blocks(llm) == 4, "the four shared full blocks keep their hash; partial ones don't"
    llm.reset_prefix_cache()
    assert vllm_internals.cached_free_blocks(llm) == 0


def test_block_size_and_hash_algo_match_what_the_engine_does(llm):
    llm.reset_prefix_cache()
    assert vllm_internals.block_size(llm) == BLOCK and vllm_internals.hash_algo(llm) == "sha256"
    prompt = list(range(200, 200 + 3 * BLOCK + 5))
    generate(llm, [prompt])
    assert generate(llm, [prompt + [9]])[0].num_cached_tokens == 3 * BLOCK


def test_resolved_settings_are_the_ones_the_engine_was_given(llm):
    assert vllm_internals.tuning(llm, "block_size") == BLOCK
    assert vllm_internals.tuning(llm, "enable_prefix_caching") is True
    assert vllm_internals.tuning(llm, "dtype") == vllm_internals.model_dtype(llm)
    assert vllm_internals.tuning(llm, "max_num_seqs") > 0, "resolved from vLLM's per-hardware default"
    assert vllm_internals.engine_arg_default("max_num_seqs") is None, "declared: decided at start-up"
    assert 0 < vllm_internals.engine_arg_default("gpu_memory_utilization") < 1
    with pytest.raises(KeyError, match="max_num_seqs"):
        vllm_internals.tuning(llm, "max_seqs")


def test_vllms_hashes_are_the_labs():
    prompt = list(range(50, 50 + 5 * BLOCK + 3))
    for salt in (None, "tenant-a"):
        assert vllm_internals.vllm_block_hashes(prompt, BLOCK, "sha256", salt) == block_hashes(prompt, BLOCK, "sha256", salt)


@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_vllms_own_kv_cache_manager_caches_what_the_lab_predicts(block_size):
    import random

    from lab.core.prefix_cache import PrefixCache

    rng = random.Random(block_size)
    shared = [rng.randrange(3, 3000) for _ in range(300)]
    requests = [shared[:rng.randrange(0, 300)] + [rng.randrange(3, 3000) for _ in range(rng.randrange(1, 200))]
                for _ in range(40)]
    cached, _ = vllm_internals.manager_replay(requests, block_size)
    assert cached == PrefixCache(num_blocks=10_000, block_size=block_size).replay(requests)
    assert sum(cached) > 0, "the streams share prefixes: some requests hit"
    assert vllm_internals.manager_replay(requests, block_size, enable_caching=False)[0] == [0] * len(requests)


def test_the_first_token_comes_out_of_the_prefill_step(llm):
    """No separate 'first-token generation' stage: the step that computes the prompt samples the first token."""
    llm.reset_prefix_cache()
    engine = vllm_internals.engine_loop(llm)
    engine.add_request("prefill-only", TokensPrompt(prompt_token_ids=list(range(100, 400))),
                       SamplingParams(max_tokens=1, temperature=0.0))
    steps, outputs = 0, []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        steps += 1
    (finished,) = [o for o in outputs if o.request_id == "prefill-only" and o.finished]
    assert len(finished.outputs[0].token_ids) == 1
    assert steps <= 2, f"{steps} engine steps for one 300-token prefill and its first token"
