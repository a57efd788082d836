"""lab.core.passage_cache: the five fills of one prompt, their exact endpoints, and the full fill against
transformers (fp32), on the tiny model and on SmolLM2."""

import pytest
import torch

from lab.core.model import ensure_model
from lab.core.passage_cache import Method, PassageEngine, ceiling

TOLERANCE = 1e-4
SMOLLM2_TOLERANCE = 5e-4  # 30 layers of fp32, as tests/test_mini_engine.py allows


@pytest.fixture(scope="module")
def model_path():
    return ensure_model("tiny")


@pytest.fixture(scope="module")
def engine(model_path):
    return PassageEngine(model_path)


def random_chunks(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 2300, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def chunks():
    return random_chunks([20, 40, 33, 40, 9])  # a system text, three passages, a question


def hf_logits(model_path, token_ids):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf, hf(torch.tensor([token_ids])).logits[0]


def biggest_gap(a, b) -> float:
    return (a.logits - b.logits).abs().max().item()


def test_the_full_fill_matches_transformers_at_every_question_position(engine, model_path, chunks):
    full = engine.fill(chunks, Method("full"))
    _, expected = hf_logits(model_path, [t for c in chunks for t in c])
    assert (full.logits - expected[-len(chunks[-1]):]).abs().max().item() <= TOLERANCE
    assert full.compute_share == 1.0


def test_greedy_tokens_after_a_full_fill_match_transformers(engine, model_path, chunks):
    prompt = [t for c in chunks for t in c]
    hf, _ = hf_logits(model_path, prompt)
    expected = list(prompt)
    with torch.no_grad():
        for _ in range(5):
            expected.append(int(hf(torch.tensor([expected])).logits[0, -1].argmax()))
    assert engine.decode(engine.fill(chunks, Method("full")), 5) == expected[len(prompt):]


def test_recomputing_every_reused_token_is_the_full_fill(engine, chunks):
    full = engine.fill(chunks, Method("full"))
    for check_layer in (0, 1, 2):
        blend = engine.fill(chunks, Method("cacheblend", ratio=1.0, check_layer=check_layer))
        assert biggest_gap(blend, full) <= TOLERANCE and blend.compute_share == 1.0
        assert engine.decode(blend, 4) == engine.decode(full, 4)
    epic_all = engine.fill(chunks, Method("epic", k=max(map(len, chunks))))
    assert biggest_gap(epic_all, full) <= TOLERANCE


def test_recomputing_nothing_is_naive_reuse(engine, chunks):
    naive = engine.fill(chunks, Method("naive"))
    assert torch.equal(engine.fill(chunks, Method("cacheblend", ratio=0.0, check_layer=-1)).logits, naive.logits)
    assert torch.equal(engine.fill(chunks, Method("epic", k=0)).logits, naive.logits)
    question_rows = len(chunks[-1]) * engine.n_layers
    assert naive.recomputed.sum().item() == question_rows  # only the question was computed


def test_the_leading_chunk_is_exact_and_a_moved_one_is_not(engine, chunks):
    full = engine.fill(chunks, Method("full"))
    prefix = engine.fill(chunks, Method("prefix"))
    assert biggest_gap(prefix, full) <= TOLERANCE  # it was computed where it sits: at position 0, after nothing
    assert not prefix.recomputed[:, : len(chunks[0])].any()
    # the passages were stored alone: reused after other text, their K/V from layer 1 up lack that text
    naive, passages = engine.fill(chunks, Method("naive")), slice(len(chunks[0]), -len(chunks[-1]))
    assert (naive.keys[1][passages] - full.keys[1][passages]).abs().max().item() > 1e-3
    assert biggest_gap(naive, full) > 10 * biggest_gap(prefix, full)


def test_a_stored_key_rotated_to_its_new_place_is_the_key_computed_there(engine, chunks):
    # layer 0's K depends on the token and its position only: a passage stored at 0 and placed at 20.. must give
    # the K a full prefill computes at 20.., which checks the rotation against the model's own
    naive, full = engine.fill(chunks, Method("naive")), engine.fill(chunks, Method("full"))
    passages = slice(len(chunks[0]), -len(chunks[-1]))
    assert (naive.keys[0][passages] - full.keys[0][passages]).abs().max().item() <= 1e-5
    assert (naive.values[0][passages] - full.values[0][passages]).abs().max().item() <= 1e-5


def test_attention_sees_distances_only_so_a_passage_can_move(model_path):
    # the premise, in transformers: a text alone at positions 500.. gives the logits it gives at 0..
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    (passage,) = random_chunks([48], seed=3)
    with torch.no_grad():
        at_0 = hf(torch.tensor([passage])).logits[0]
        at_500 = hf(torch.tensor([passage]), position_ids=torch.arange(500, 548)[None]).logits[0]
    assert (at_0 - at_500).abs().max().item() <= TOLERANCE


def test_cacheblend_computes_what_its_ceiling_says(engine, chunks):
    blend = engine.fill(chunks, Method("cacheblend", ratio=0.15, check_layer=1))
    reused = sum(map(len, chunks[:-1]))
    rows = blend.recomputed.sum(dim=1)
    assert rows[:2].tolist() == [sum(map(len, chunks))] * 2  # the check layer and the one before it: every token
    assert rows[2:].tolist() == [round(0.15 * reused) + len(chunks[-1])] * (engine.n_layers - 2)
    assert ceiling(4, 1, 0.15) == pytest.approx(1 / (2 / 4 + 0.15 * 2 / 4))
    assert ceiling(30, 1, 0.15) == pytest.approx(4.84, abs=0.01)  # SmolLM2's 30 layers


def test_cacheblend_chooses_the_tokens_whose_keys_moved_most(engine, chunks):
    # the leading chunk sits where it was computed: its keys did not move, so none of them is chosen
    blend = engine.fill(chunks, Method("cacheblend", ratio=0.3, check_layer=1))
    assert not blend.recomputed[2:, : len(chunks[0])].any()
    assert blend.recomputed[2:, len(chunks[0]): -len(chunks[-1])].any()


def test_epic_recomputes_the_first_k_tokens_of_each_reused_chunk(engine, chunks):
    epic = engine.fill(chunks, Method("epic", k=4))
    expected = torch.zeros(sum(map(len, chunks)), dtype=torch.bool)
    for start in (20, 60, 93):  # the passages; the system text at 0 sits where it was computed
        expected[start: start + 4] = True
    expected[-len(chunks[-1]):] = True
    assert all(torch.equal(epic.recomputed[layer], expected) for layer in range(engine.n_layers))


def test_each_chunk_is_computed_once_and_kept(engine):
    chunks = random_chunks([16, 16, 4], seed=7)
    engine.fill(chunks, Method("naive"))
    stored = engine.store[tuple(chunks[1])]
    engine.fill([chunks[1], chunks[0], chunks[2]], Method("naive"))
    assert engine.store[tuple(chunks[1])] is stored
    assert stored.keys.shape == (engine.n_layers, 16, engine.n_kv_heads, engine.head_dim)


@pytest.mark.parametrize("kwargs, named", [
    ({"name": "blend"}, "method name"), ({"name": "cacheblend", "ratio": 1.5}, "ratio"),
    ({"name": "cacheblend", "check_layer": -2}, "check_layer"), ({"name": "epic", "k": -1}, "k="),
])
def test_a_bad_method_is_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        Method(**kwargs)


def test_bad_prompts_are_named(engine):
    with pytest.raises(ValueError, match="check_layer=4"):
        engine.fill(random_chunks([8, 4]), Method("cacheblend", check_layer=4))
    with pytest.raises(ValueError, match="token id 9999 is outside the model's vocabulary of 2560"):
        engine.fill([[5, 9999], [6]], Method("full"))
    with pytest.raises(ValueError, match="non-empty"):
        engine.fill([[1, 2], []], Method("full"))
    with pytest.raises(ValueError, match="context of 4096"):
        engine.fill([list(range(3, 4000)), list(range(3, 200))], Method("naive"))
    with pytest.raises(ValueError, match="ratio=0 or 1"):
        engine.fill(random_chunks([8, 8, 4]), Method("cacheblend", ratio=0.5, check_layer=-1))
    assert engine.fill(random_chunks([8, 4]), Method("cacheblend", ratio=1.0, check_layer=-1)).compute_share == 1.0
    with pytest.raises(ValueError, match="max_tokens=200 exceeds"):
        engine.decode(engine.fill([[3 + i % 2000 for i in range(3987)], [5, 6]], Method("full")), 200)


def test_smollm2_recompute_all_is_full_and_full_is_transformers(smollm2_model):
    engine = PassageEngine(smollm2_model)
    chunks = random_chunks([12, 30, 30, 6], seed=1)
    full = engine.fill(chunks, Method("full"))
    _, expected = hf_logits(smollm2_model, [t for c in chunks for t in c])
    assert (full.logits - expected[-6:]).abs().max().item() <= SMOLLM2_TOLERANCE
    blend = engine.fill(chunks, Method("cacheblend", ratio=1.0, check_layer=1))
    assert biggest_gap(blend, full) <= SMOLLM2_TOLERANCE and engine.decode(blend, 4) == engine.decode(full, 4)
