"""The lab's random-weight Llamas (`tiny`, `small`), built deterministically from the committed
corpus.

No model hub is reachable from the lab's machines, so the lab trains a byte-level BPE tokenizer on
the sentences under `data/corpus/` and writes a randomly initialised Llama in Hugging Face format.
The weights carry no knowledge (every answer is gibberish); they exist so the real engines have a
model that starts in seconds, and prefix caching behaves the same on them as on any Llama.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from lab import PROJECT_ROOT

CORPUS_DIR = PROJECT_ROOT / "data" / "corpus"
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    tokenizer_vocab_size: int = 4096


PRESETS: dict[str, Preset] = {
    # Seconds per notebook on a laptop CPU.
    "tiny": Preset(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
    ),
    # Llama-shaped at a few hundred MFLOPs per token, for people with more time.
    "small": Preset(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
    ),
}


def corpus_lines(*names: str) -> list[str]:
    """The non-empty lines of the committed corpus files `names` (default: every file, the English
    and Chinese sentences and the templates the tokenizer is trained on)."""
    files = [CORPUS_DIR / n for n in names] if names else sorted(CORPUS_DIR.glob("*.txt"))
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no corpus files {names or '(*.txt)'} under {CORPUS_DIR}")
    return [
        line for f in files for line in f.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer that prepends <s>, as Llama's does."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    bos_id = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return tokenizer


def _padded(n: int, multiple: int = 64) -> int:
    return -(-n // multiple) * multiple


def llama_config(
    preset: Preset, vocab_size: int, bos_id: int, eos_id: int, name: str, seed: int
) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": preset.hidden_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "head_dim": preset.hidden_size // preset.num_attention_heads,
        "intermediate_size": preset.intermediate_size,
        "max_position_embeddings": preset.max_position_embeddings,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "lab_preset": name,
        "lab_seed": seed,
    }


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Llama weights in Hugging Face names, drawn from one seeded generator in a fixed order."""
    gen = torch.Generator().manual_seed(seed)
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    weights = {"model.embed_tokens.weight": normal(vocab, h, std=1.0)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": normal(q_out, h),
            p + "self_attn.k_proj.weight": normal(kv_out, h),
            p + "self_attn.v_proj.weight": normal(kv_out, h),
            p + "self_attn.o_proj.weight": normal(h, q_out),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "mlp.gate_proj.weight": normal(inter, h),
            p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
        }
    weights["model.norm.weight"] = torch.ones(h)
    weights["lm_head.weight"] = normal(vocab, h)
    return weights


def _write_tokenizer_files(tokenizer, out_dir: Path, max_len: int) -> None:
    tokenizer.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "</s>",
        "add_bos_token": True,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", special)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(
        json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def build_random_model(out_dir: Path, preset: str, seed: int) -> Path:
    """Write preset `preset` with weights drawn from `seed` and the lab's tokenizer to `out_dir`.

    The same preset and seed always give the same tokenizer and byte-identical weights.
    """
    spec = PRESETS[preset]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.tokenizer_vocab_size)
    config = llama_config(
        spec,
        vocab_size=_padded(tokenizer.get_vocab_size()),
        bos_id=tokenizer.token_to_id("<s>"),
        eos_id=tokenizer.token_to_id("</s>"),
        name=preset,
        seed=seed,
    )
    save_file(
        random_weights(config, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
    )
    _write_tokenizer_files(tokenizer, out_dir, spec.max_position_embeddings)
    return out_dir
