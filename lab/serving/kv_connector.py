"""vLLM's own KV connector as a tier that outlives the server: `ExampleConnector` writes each
request's K/V to disk and a later server, started on the same folder, loads it instead of computing
it.

    with VLLMServer(model, block_size=32, extra_args=example_connector_flags(folder)) as server: ...

It runs on the CPU back-end (the offloading connectors refuse it). Its design is a teaching one: a
folder per prompt, named by a hash of the prompt's token ids (block-aligned, less the last token),
holding a safetensors file per layer. So only a prompt with the same full blocks finds it again; a
longer prompt that runs into a further block finds nothing, though every block of the stored one
begins it. A server reports what it loaded in `vllm:external_prefix_cache_hits` (tokens) and
`vllm:prompt_tokens_by_source`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

CONNECTOR = "ExampleConnector"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"


def example_connector_config(folder: str | Path) -> dict:
    """The `--kv-transfer-config` that stores to and loads from `folder` (a role that does both)."""
    return {
        "kv_connector": CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(Path(folder).resolve())},
    }


def example_connector_flags(folder: str | Path) -> list[str]:
    """The server flags for `example_connector_config(folder)`."""
    return ["--kv-transfer-config", json.dumps(example_connector_config(folder))]


def stored_prompts(folder: str | Path) -> pd.DataFrame:
    """What the connector keeps: a row per prompt folder with its files (one per layer) and their
    bytes."""
    rows = (
        [
            {
                "prompt_folder": d.name,
                "files": len(files := list(d.glob("*.safetensors"))),
                "bytes": sum(f.stat().st_size for f in files),
            }
            for d in sorted(Path(folder).iterdir())
            if d.is_dir()
        ]
        if Path(folder).is_dir()
        else []
    )
    return pd.DataFrame(rows, columns=["prompt_folder", "files", "bytes"])


@dataclass(frozen=True)
class RestartPrompts:
    stored: list[str]  # sent to the first server, then to the second
    cold: list[str]  # one per stored prompt, never stored, about as long
    longer: str  # sent to the first server, then to the second with `extra` after it
    extra: str = " " + " ".join(["and one more sentence after it"] * 12)  # runs into further blocks

    def __post_init__(self) -> None:
        if len(self.stored) != len(self.cold) or not self.stored:
            raise ValueError(
                f"stored ({len(self.stored)}) and cold ({len(self.cold)}) need the same number of "
                "prompts, at least one"
            )


def measure_restart(
    model: str | Path,
    folder: str | Path,
    prompts: RestartPrompts,
    *,
    block_size: int = 32,
    max_tokens: int = 8,
) -> pd.DataFrame:
    """Serve the stored prompts on one server with the connector, stop it, and start a new one on
    the same folder. There, first the longer prompt with `extra` after it (never sent so to the
    first server); then for each i: `cold[i]`, `stored[i]` (its K/V on disk: an external hit) and
    `stored[i]` again (now in the pool: a local hit). A row per request of the second server: its
    TTFT, cached tokens, the external hits its own /metrics counted for it, and whether its output
    equals the first server's for that prompt."""
    from lab.serving.client import stream_completion
    from lab.serving.server import VLLMServer

    stored, cold, longer = prompts.stored, prompts.cold, prompts.longer
    flags = example_connector_flags(folder)
    first = {}
    with VLLMServer(model, block_size=block_size, extra_args=flags) as server:
        for prompt in [*stored, longer]:
            first[prompt] = stream_completion(
                server.client(), server.model_name, prompt, max_tokens=max_tokens
            ).text
    rows = []
    with VLLMServer(model, block_size=block_size, extra_args=flags) as server:

        def send(kind: str, i: int, prompt: str, reference: str | None) -> None:
            before = server.metrics().get(EXTERNAL_HITS, 0.0)
            result = stream_completion(
                server.client(), server.model_name, prompt, max_tokens=max_tokens
            )
            rows.append(
                {
                    "request": i,
                    "kind": kind,
                    "ttft_s": result.ttft_s,
                    "prompt_tokens": result.prompt_tokens,
                    "cached_tokens": result.cached_tokens,
                    "external_hit_tokens": int(server.metrics().get(EXTERNAL_HITS, 0.0) - before),
                    "same_output": None if reference is None else result.text == reference,
                }
            )

        send("longer", -1, longer + prompts.extra, None)
        for i, (stored_prompt, cold_prompt) in enumerate(zip(stored, cold)):
            send("cold", i, cold_prompt, None)
            send("external", i, stored_prompt, first[stored_prompt])
            send("local", i, stored_prompt, first[stored_prompt])
    return pd.DataFrame(rows)
