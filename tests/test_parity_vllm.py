"""lab.prefix_cache against the real vLLM engine: the same token ids, sent one request at a time, must get
the same number of cached tokens, with salts and under eviction."""

import random

import pytest

from lab.engine import make_llm
from lab.prefix_cache import PrefixCache

pytestmark = pytest.mark.filterwarnings("ignore")


def request_stream(block_size, max_len, n, seed):
    """Prompts drawn from a few shared prefixes: full, block-aligned and half-length cuts, varied tails."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 2300) for _ in range(rng.randrange(block_size, 4 * block_size))] for _ in range(4)]
    for _ in range(n):
        prefix = rng.choice(prefixes)
        cut = rng.choice([len(prefix), len(prefix) // block_size * block_size, len(prefix) // 2])
        tail = [rng.randrange(3, 2300) for _ in range(rng.choice([0, 1, 5, block_size, 2 * block_size + 3]))]
        yield (prefix[:cut] + tail)[:max_len] or [5], rng.choice([None, None, "alice", "bob"])


@pytest.mark.parametrize("block_size, usable_blocks", [(32, 24), (64, 12), (128, 8), (32, 400)])
def test_cached_token_counts_match_vllm(block_size, usable_blocks):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    max_len = min(usable_blocks * block_size, 1024)
    # vLLM keeps one block as its null block, so N usable blocks need an override of N + 1.
    llm = make_llm(block_size=block_size, num_gpu_blocks_override=usable_blocks + 1, max_model_len=max_len)
    cache = PrefixCache(num_blocks=usable_blocks, block_size=block_size)
    greedy_one_token = SamplingParams(max_tokens=1, temperature=0.0)
    compared = []
    for i, (token_ids, salt) in enumerate(request_stream(block_size, max_len - 1, n=60, seed=block_size)):
        prompt = TokensPrompt(prompt_token_ids=token_ids, **({"cache_salt": salt} if salt else {}))
        out = llm.generate([prompt], greedy_one_token, use_tqdm=False)[0]
        ours = cache.allocate(f"r{i}", token_ids, cache_salt=salt)
        cache.free(f"r{i}")
        compared.append((ours, out.num_cached_tokens))
    assert [o for o, _ in compared] == [v for _, v in compared]
    assert sum(v > 0 for _, v in compared) >= 10, "the stream must exercise hits"
    if usable_blocks < 100:
        assert cache.stats.evictions > 0, "the small pool must exercise eviction"
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:prefix_cache_")}
    assert metrics["vllm:prefix_cache_hits"] == cache.stats.hits
    assert metrics["vllm:prefix_cache_queries"] == cache.stats.queries
