import json

import pytest
import torch
from safetensors.torch import load_file

import lab.core.model
from lab.core.model import (
    build_model,
    count_weights,
    describe_model,
    ensure_model,
    parameter_count,
)


@pytest.fixture(scope="module")
def built_twice(tmp_path_factory):
    first = build_model(tmp_path_factory.mktemp("a"), preset="tiny", seed=0)
    second = build_model(tmp_path_factory.mktemp("b"), preset="tiny", seed=0)
    return first, second


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"])
def test_same_preset_and_seed_give_identical_files(built_twice, name):
    first, second = built_twice
    assert (first / name).read_bytes() == (second / name).read_bytes()


def test_another_seed_gives_other_weights(built_twice, tmp_path):
    other = build_model(tmp_path, preset="tiny", seed=1)
    a = load_file(built_twice[0] / "model.safetensors")
    b = load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])
    assert (built_twice[0] / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_transformers_loads_it_and_counts_the_same_parameters(built_twice):
    from transformers import AutoTokenizer, LlamaForCausalLM

    path = built_twice[0]
    model = LlamaForCausalLM.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == parameter_count("tiny", model.config.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(path)
    for text in ["Please translate the following sentence.", "请将下面的英文句子翻译成中文。"]:
        ids = tokenizer.encode(text)
        assert ids[0] == model.config.bos_token_id, "prompts start with <s>, as Llama's do"
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
        assert max(ids) < model.config.vocab_size


def test_tokenizer_compresses_the_corpus_languages(built_twice):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built_twice[0])
    text = "The customer wants to know where their parcel is and when it will arrive."
    assert len(tokenizer.encode(text)) < len(text.encode()) / 2


def test_config_is_a_llama_with_grouped_query_attention(built_twice):
    config = json.loads((built_twice[0] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["lab_preset"] == "tiny" and config["torch_dtype"] == "float32"


def test_unknown_preset_is_rejected_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"preset='huge'.*small.*tiny"):
        build_model(tmp_path, preset="huge")


def test_ensure_model_builds_once_then_reuses(tmp_path, monkeypatch):
    monkeypatch.setattr(lab.core.model, "MODELS_DIR", tmp_path)
    path = ensure_model("tiny")
    assert path == tmp_path / "tiny-seed0" and (path / "model.safetensors").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-seed0"], "no staging directories left behind"


def test_the_description_counts_the_weights_on_disk(built_twice, tmp_path):
    weights = load_file(built_twice[0] / "model.safetensors")
    count = sum(t.numel() for t in weights.values())
    assert count_weights(built_twice[0]) == count == parameter_count("tiny")
    assert describe_model(built_twice[0]) == f"the lab's `tiny` preset (random weights, {count / 1e6:.1f} M parameters, float32)"
    assert describe_model(tmp_path / "Llama-2-7b-chat-hf") == "`Llama-2-7b-chat-hf`", "a model not on this machine"
