"""lab.core.prefix_cache against the real vLLM engine: the same token ids, sent one request at a time, must get
the same number of cached tokens, with salts, under eviction, and when prompts extend earlier outputs."""

import random

import pytest

from lab.core.prefix_cache import PrefixCache
from lab.serving.engine import generate, make_llm

pytestmark = pytest.mark.engine  # every test here runs vLLM


def next_prompt(rng, prefixes, histories, block_size, max_len):
    """A prompt from a few shared prefixes (full, block-aligned or half cuts) or extending an earlier
    request's prompt and output, as a chat turn does; with a varied tail and salt."""
    if histories and rng.random() < 0.3:
        base, salt = rng.choice(histories)
    else:
        prefix = rng.choice(prefixes)
        base = prefix[:rng.choice([len(prefix), len(prefix) // block_size * block_size, len(prefix) // 2])]
        salt = rng.choice([None, None, "alice", "bob"])
    tail = [rng.randrange(3, 2300) for _ in range(rng.choice([0, 1, 5, block_size, 2 * block_size + 3]))]
    return (base + tail)[:max_len] or [5], salt


@pytest.mark.parametrize("block_size, usable_blocks", [(32, 24), (64, 12), (128, 8), (32, 400)])
def test_cached_token_counts_match_vllm(block_size, usable_blocks):
    max_len = min(usable_blocks * block_size, 1024)
    # vLLM keeps one block as its null block, so N usable blocks need an override of N + 1.
    llm = make_llm(block_size=block_size, num_gpu_blocks_override=usable_blocks + 1, max_model_len=max_len)
    cache = PrefixCache(num_blocks=usable_blocks, block_size=block_size)
    rng = random.Random(block_size)
    prefixes = [[rng.randrange(3, 2300) for _ in range(rng.randrange(block_size, 4 * block_size))] for _ in range(4)]
    histories, compared = [], []
    for i in range(60):
        token_ids, salt = next_prompt(rng, prefixes, histories, block_size, max_len - 8)
        out = generate(llm, [token_ids], max_tokens=rng.choice([1, 1, 5]), cache_salt=salt, ignore_eos=True)[0]
        output = list(out.outputs[0].token_ids)
        ours = cache.allocate(f"r{i}", token_ids, cache_salt=salt)
        cache.append_tokens(f"r{i}", output[:-1])  # the last sampled token is never fed back
        cache.free(f"r{i}")
        compared.append((ours, out.num_cached_tokens))
        histories.append((token_ids + output, salt))
    assert [o for o, _ in compared] == [v for _, v in compared]
    assert sum(v > 0 for _, v in compared) >= 10, "the stream must exercise hits"
    if usable_blocks < 100:
        assert cache.stats.evictions > 0, "the small pool must exercise eviction"
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:prefix_cache_")}
    assert metrics["vllm:prefix_cache_hits"] == cache.stats.hits
    assert metrics["vllm:prefix_cache_queries"] == cache.stats.queries


@pytest.mark.parametrize("max_tokens, expected_hit", [(5, 0), (6, 32)])
def test_decoded_tokens_fill_blocks_but_the_last_sampled_token_has_no_kv(max_tokens, expected_hit):
    """27 prompt tokens + 5 generated: K/V exist for 31 tokens, so block 0 is not full and not cached.
    With 6 generated, K/V cover 32 tokens: block 0 is full, cached, and the follow-up request hits it."""
    llm = make_llm(block_size=32, max_model_len=256)
    cache = PrefixCache(num_blocks=64, block_size=32)
    prompt = list(range(100, 127))
    output = list(generate(llm, [prompt], max_tokens=max_tokens, ignore_eos=True)[0].outputs[0].token_ids)
    cache.allocate("first", prompt)
    cache.append_tokens("first", output[:-1])
    cache.free("first")
    follow_up = prompt + output + list(range(500, 510))
    vllm_hit = generate(llm, [follow_up], max_tokens=max_tokens, ignore_eos=True)[0].num_cached_tokens
    assert vllm_hit == cache.allocate("second", follow_up) == expected_hit
