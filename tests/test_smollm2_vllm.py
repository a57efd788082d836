"""The real vLLM on real weights (SmolLM2-135M-Instruct, fp32): caching leaves real chat answers unchanged, vLLM's
own chat rendering is the lab's, and lab.core.prefix_cache predicts vLLM's cached tokens request by request on
prompts built with the model's own tokenizer and chat template (one document shared by every question, and a
conversation that grows turn by turn)."""

import pytest

from lab.core.model import chat_token_ids, ensure_model, tokenizer_for
from lab.core.prefix_cache import PrefixCache
from lab.core.random_model import corpus_lines
from lab.serving.engine import generate, make_llm

pytestmark = pytest.mark.engine

BLOCK, USABLE_BLOCKS, MAX_TOKENS = 32, 96, 12
QUESTIONS = ["What is the capital of France?", "Can I cancel my order after it has left the warehouse?",
             "How many days do I have to send a photo of a damaged item?", "What is the capital of France?"]


@pytest.fixture(scope="module")
def smollm2():
    path = ensure_model("smollm2")
    return path, tokenizer_for(path)


@pytest.fixture(scope="module")
def document():
    return " ".join(corpus_lines("en.txt", "templates.txt"))


def conversation(tokenizer, document, answers):
    """The requests in order: each question behind the shared document, then one conversation that carries
    its earlier answers forward (each turn extends the previous prompt with its answer)."""
    system = {"role": "system", "content": document}
    for question in QUESTIONS:
        yield chat_token_ids(tokenizer, [system, {"role": "user", "content": question}])
    turns = [system]
    for question in QUESTIONS[:3]:
        turns.append({"role": "user", "content": question})
        yield chat_token_ids(tokenizer, turns)
        turns.append({"role": "assistant", "content": answers[-1]})  # the answer to the prompt just sent


def serve(llm, tokenizer, document, cache=None):
    """Send every request of the conversation one at a time; (token ids, cached tokens, answer) per request."""
    answers, rows = [], []
    for i, token_ids in enumerate(conversation(tokenizer, document, answers)):
        out = generate(llm, [token_ids], max_tokens=MAX_TOKENS)[0]
        output = list(out.outputs[0].token_ids)
        if cache is not None:
            ours = cache.allocate(f"r{i}", token_ids)
            cache.append_tokens(f"r{i}", output[:-1])  # the last sampled token is never fed back
            cache.free(f"r{i}")
            rows.append((ours, out.num_cached_tokens))
        else:
            rows.append((out.num_cached_tokens, None))
        answers.append(out.outputs[0].text)
        yield token_ids, rows[-1], out.outputs[0].text, tuple(output)


@pytest.fixture(scope="module")
def runs(smollm2, document):
    path, tokenizer = smollm2
    # vLLM keeps one block as its null block: N usable blocks need an override of N + 1
    on = make_llm(path, block_size=BLOCK, num_gpu_blocks_override=USABLE_BLOCKS + 1, max_model_len=USABLE_BLOCKS * BLOCK)
    with_cache = list(serve(on, tokenizer, document, PrefixCache(num_blocks=USABLE_BLOCKS, block_size=BLOCK)))
    chat_check = on.chat([{"role": "user", "content": "What is the capital of France?"}],
                         use_tqdm=False)[0].prompt_token_ids  # vLLM's own rendering, after the compared requests
    engine_tokens = [on.get_tokenizer().encode(text) for text in (document, *QUESTIONS)]
    off = make_llm(path, block_size=BLOCK, enable_prefix_caching=False, max_model_len=USABLE_BLOCKS * BLOCK)
    without_cache = list(serve(off, tokenizer, document))
    return chat_check, with_cache, without_cache, engine_tokens


def test_vllm_tokenizes_and_renders_a_chat_as_the_lab_does(runs, smollm2, document):
    chat_check, _, _, engine_tokens = runs
    _, tokenizer = smollm2
    assert chat_check == chat_token_ids(tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    assert engine_tokens == [tokenizer.encode(text) for text in (document, *QUESTIONS)], "tokenizer_for is the engine's"
    assert engine_tokens[0] != tokenizer_for(None).encode(document), "and not the tiny model's"


def test_caching_leaves_every_real_answer_unchanged(runs):
    _, with_cache, without_cache, _ = runs
    assert [r[0] for r in with_cache] == [r[0] for r in without_cache], "the same prompts, turn by turn"
    assert [r[3] for r in with_cache] == [r[3] for r in without_cache], "greedy answers, caching on and off"
    assert all(r[1][0] == 0 for r in without_cache), "caching off: nothing is cached"
    assert sum(r[1][1] > 0 for r in with_cache) >= 5, "caching on: the shared document and earlier turns hit"
    assert "Paris" in with_cache[0][2] and with_cache[3][2] == with_cache[0][2], "a real answer, the same on a hit"


def test_the_lab_cache_predicts_vllm_cached_tokens_request_by_request(runs):
    _, with_cache, _, _ = runs
    ours, vllm = [r[1][0] for r in with_cache], [r[1][1] for r in with_cache]
    assert ours == vllm
    assert all(v % BLOCK == 0 for v in vllm)
