"""One description of how the lab starts a vLLM engine, rendered two ways: keyword arguments for the
in-process `vllm.LLM(...)` and command-line flags for the OpenAI server, so the two cannot drift
apart.

    settings = engine_settings(None, block_size=32)     # the lab's tiny model on this back-end
    vllm.LLM(**settings.llm_kwargs())                 # lab.serving.engine.make_llm does this
    settings.server_args()                            # lab.serving.server.VLLMServer passes these

Inputs are checked here, before any engine starts: a block size the back-end rejects, a missing
model, a context longer than the model's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lab import DEFAULT_CPU_KVCACHE_GIB
from lab.checks import positive_int
from lab.core.model import ensure_model
from lab.serving.backend import backend

CPU_BLOCK_MULTIPLE = 32  # the CPU attention back-end accepts only multiples of 32


@dataclass(frozen=True)
class EngineSettings:
    """Engine arguments (vLLM's `EngineArgs` names) plus the one setting vLLM reads from the
    environment."""

    model: str
    enable_prefix_caching: bool | None = True  # None: vLLM's own default (on, in the V1 engine)
    block_size: int | None = None  # None: the back-end's default
    seed: int = 0
    enforce_eager: bool = (
        False  # the CPU default is True: the engine starts in seconds, not half a minute
    )
    dtype: str = (
        "auto"  # the lab's models say float32: vLLM would otherwise run their fp32 weights in bf16
    )
    disable_log_stats: bool = False  # per-request timestamps (TTFT, queue time) need stats on
    engine_args: Mapping[str, Any] = field(default_factory=dict)  # any further EngineArgs, by name
    cpu_kvcache_gib: str = DEFAULT_CPU_KVCACHE_GIB  # VLLM_CPU_KVCACHE_SPACE on the CPU back-end

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM`."""
        kwargs = {
            "model": self.model,
            "enable_prefix_caching": self.enable_prefix_caching,
            "seed": self.seed,
            "enforce_eager": self.enforce_eager,
            "dtype": self.dtype,
            "disable_log_stats": self.disable_log_stats,
            "block_size": self.block_size,
        }
        return {
            name: value
            for name, value in (kwargs | dict(self.engine_args)).items()
            if value is not None
        }

    def server_args(self) -> list[str]:
        """The same settings as server flags (after the model, which the caller places)."""
        args: list[str] = []
        for name, value in self.llm_kwargs().items():
            if name != "model":
                args += _flag(name, value)
        return args

    def environment(self) -> dict[str, str]:
        """Variables the engine reads from its environment."""
        return {"VLLM_CPU_KVCACHE_SPACE": str(self.cpu_kvcache_gib)} if backend() == "cpu" else {}


SWITCHES = {"disable_log_stats"}  # vLLM's plain on-switches: off unless given, no `--no-` form


def _flag(name: str, value: Any) -> list[str]:
    """One engine argument as vLLM's CLI spells it: `--name value`, `--name` / `--no-name` for
    booleans."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        if name in SWITCHES:
            return [flag] if value else []
        return [flag] if value else ["--no-" + flag[2:]]
    if isinstance(value, (dict, list)):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def accepted_block_sizes() -> tuple[int, ...]:
    """Block sizes worth comparing on this back-end: vLLM's CPU attention needs multiples of 32."""
    return (32, 64, 128) if backend() == "cpu" else (16, 32, 64, 128)


def check_block_size(block_size: Any) -> None:
    """Raise ValueError unless `block_size` is one the current back-end accepts (None: engine
    default)."""
    if block_size is None:
        return
    positive_int("block_size", block_size, "a positive integer (tokens per KV block), e.g. 32")
    if backend() == "cpu" and block_size % CPU_BLOCK_MULTIPLE:
        lower = max(CPU_BLOCK_MULTIPLE, block_size // CPU_BLOCK_MULTIPLE * CPU_BLOCK_MULTIPLE)
        raise ValueError(
            f"block_size={block_size} is rejected by vLLM's CPU attention back-end, which needs a multiple "
            f"of {CPU_BLOCK_MULTIPLE} (e.g. {lower} or {lower + CPU_BLOCK_MULTIPLE}); study smaller blocks "
            f"with lab.core.prefix_cache, or run on a GPU"
        )


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def _cached_hub_model(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def resolve_model(model: str | os.PathLike | None) -> str:
    """The path (or cached hub id) vLLM should load; None means the lab's tiny model."""
    if model is None:
        return str(ensure_model("tiny"))
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model={str(model)!r} holds no config.json: not a Hugging Face model directory"
            )
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise FileNotFoundError(
                f"model={str(model)!r} has a config.json but no weights (*.safetensors or *.bin)"
            )
        return str(path)
    if _looks_like_hub_id(str(model)) and _cached_hub_model(str(model)):
        return str(model)
    raise FileNotFoundError(
        f"model={str(model)!r} does not exist. Pass a local directory with config.json and weights, "
        f"None for the lab's tiny model, or lab.core.model.ensure_model('smollm2') for the trained SmolLM2 (or 'small')"
    )


def model_config(model_path: str) -> dict:
    """config.json of a local model ({} for a hub id)."""
    config = Path(model_path) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else {}


def check_max_model_len(max_model_len: Any, config: dict) -> None:
    if max_model_len is None:
        return
    positive_int("max_model_len", max_model_len, "a positive integer (tokens)")
    limit = config.get("max_position_embeddings")
    if limit and max_model_len > limit:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}"
        )


def engine_settings(
    model: str | os.PathLike | None = None,
    *,
    enable_prefix_caching: bool | None = True,
    block_size: int | None = None,
    **engine_args: Any,
) -> EngineSettings:
    """The lab's settings for this back-end and model, after checking every input; `engine_args` are
    further `EngineArgs` by name (`max_model_len`, `num_gpu_blocks_override`, ...) and win over the
    defaults. `enable_prefix_caching=None` passes no caching setting at all: vLLM's own default
    applies (on, in V1)."""
    if enable_prefix_caching is not None and not isinstance(enable_prefix_caching, bool):
        raise ValueError(
            f"enable_prefix_caching={enable_prefix_caching!r}: use True, False or None (vLLM's default)"
        )
    check_block_size(block_size)
    model_path = resolve_model(model)
    config = model_config(model_path)
    check_max_model_len(engine_args.get("max_model_len"), config)
    defaults = {
        "enforce_eager": backend() == "cpu",
        "dtype": "float32" if "lab_preset" in config else "auto",
    }
    own = {f.name: engine_args.pop(f.name) for f in fields(EngineSettings) if f.name in engine_args}
    engine_args = {
        "use_tqdm_on_load": False
    } | engine_args  # in Jupyter, vLLM's loading bar is a widget per start
    return EngineSettings(
        model=model_path,
        enable_prefix_caching=enable_prefix_caching,
        block_size=block_size,
        engine_args=engine_args,
        cpu_kvcache_gib=os.environ.get("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB),
        **(defaults | own),
    )
