"""N real vLLM servers behind the real `vllm-router`, as one context manager.

    with Fleet(replicas=2, policy="cache_aware") as fleet:
        result = stream_completion(fleet.client(), fleet.model_name, prompt)
        fleet.replica_metrics()        # one parsed /metrics per replica

        fleet.use_policy("round_robin")  # a new router in front of the same replicas
        fleet.reset_prefix_caches()      # every replica starts cold again

Each replica is a `lab.serving.server.VLLMServer` with its own KV pool (`kv_blocks` usable blocks),
`--enable-scale-out` (the router prepares prompts through the replicas' `/v1/completions/render`,
which vLLM refuses without it), vLLM's development endpoints (for `/reset_prefix_cache`), KV events
published on a port of its own (for `kv_aware`) and, on a CPU, its own core. Replicas start once;
switching policy restarts only the router, in about a second. Every process runs in its own process
group and is stopped when the block ends, when a start fails, or when Python exits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.checks import positive_int
from lab.core.block_hash import blocks_needed
from lab.serving.backend import backend
from lab.serving.client import openai_client
from lab.serving.engine_settings import check_block_size, model_config, resolve_model
from lab.serving.processes import free_port
from lab.serving.router import Router, check_policy, router_executable
from lab.serving.server import SERVED_MODEL_NAME, VLLMServer


def check_fleet(
    replicas: Any, policy: Any, kv_blocks: Any, block_size: int, max_model_len: int
) -> None:
    """Raise ValueError, before any process starts, on a fleet this machine or the router cannot
    run."""
    positive_int("replicas", replicas, "a positive number of vLLM servers, e.g. 2")
    cores = os.cpu_count() or 1
    if backend() == "cpu" and replicas > cores:
        raise ValueError(
            f"replicas={replicas}: this CPU has {cores} cores and each CPU replica needs one of its "
            f"own; use at most {cores}"
        )
    check_policy(policy)
    positive_int("kv_blocks", kv_blocks, "a positive number of usable KV blocks per replica")
    if kv_blocks * block_size < max_model_len:
        raise ValueError(
            f"kv_blocks={kv_blocks} x block_size={block_size} = {kv_blocks * block_size} tokens cannot "
            f"hold one prompt of max_model_len={max_model_len}: use kv_blocks >= "
            f"{blocks_needed(max_model_len, block_size)}, or pass a smaller max_model_len in engine_args"
        )


@dataclass(eq=False)
class Fleet:
    replicas: int = 2
    policy: str = "cache_aware"
    model: str | os.PathLike | None = None
    block_size: int = 32
    kv_blocks: int = 160  # usable KV blocks per replica
    engine_args: Mapping[str, Any] = field(
        default_factory=dict
    )  # further EngineArgs for every replica
    router_args: Sequence[str] = ()  # further vllm-router flags, e.g. ("--cache-threshold", "0.5")
    startup_timeout_s: float = 300.0

    model_name = SERVED_MODEL_NAME

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        model_path = resolve_model(self.model)
        max_model_len = (
            self.engine_args.get("max_model_len")
            or model_config(model_path)["max_position_embeddings"]
        )
        check_fleet(self.replicas, self.policy, self.kv_blocks, self.block_size, max_model_len)
        router_executable()  # a missing router fails here, before any server starts
        self.event_ports = [free_port() for _ in range(self.replicas)]
        self.servers = [self._replica(model_path, i) for i in range(self.replicas)]
        self.router = self._router(self.policy, self.router_args)

    def _replica(self, model_path: str, index: int) -> VLLMServer:
        # a bind address: with 127.0.0.1 vLLM's publisher connects instead of binding, and nothing
        # arrives
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.event_ports[index]}",
        }
        environment = {"VLLM_CPU_OMP_THREADS_BIND": str(index)} if backend() == "cpu" else {}
        return VLLMServer(
            model_path,
            block_size=self.block_size,
            dev_endpoints=True,
            environment=environment,
            extra_args=["--enable-scale-out", "--kv-events-config", json.dumps(events)],
            engine_args={"num_gpu_blocks_override": self.kv_blocks + 1} | dict(self.engine_args),
            startup_timeout_s=self.startup_timeout_s,
        )

    def _router(self, policy: str, router_args: Sequence[str]) -> Router:
        events = []
        if policy == "kv_aware":
            for server, port in zip(self.servers, self.event_ports):  # one flag per replica
                events += ["--kv-event-source", f"{server.url}=tcp://127.0.0.1:{port}"]
            events += [
                "--kv-event-block-size",
                str(self.block_size),
                "--kv-event-model",
                SERVED_MODEL_NAME,
            ]
        return Router([s.url for s in self.servers], policy, [*events, *router_args])

    def use_policy(self, policy: str, router_args: Sequence[str] = ()) -> None:
        """Replace the router with one running `policy` (and `router_args`), in front of the same
        replicas."""
        check_policy(policy)
        self.router.stop()
        self.policy, self.router_args = policy, tuple(router_args)
        self.router = self._router(policy, router_args).start()

    def reset_prefix_caches(self) -> None:
        """Empty every replica's prefix cache."""
        for server in self.servers:
            server.reset_prefix_cache()

    @property
    def base_url(self) -> str:
        return f"{self.router.url}/v1"

    def start(self) -> Fleet:
        """Start every replica side by side, then the router; on any failure stop them all."""
        try:
            for server in self.servers:
                server.launch()
            for server in self.servers:
                server.wait_until_healthy()
            self.router.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the router and every replica (idempotent)."""
        self.router.stop()
        for server in self.servers:
            server.stop()

    def client(self):
        return openai_client(self.base_url)

    def replica_metrics(self) -> list[dict[str, float]]:
        """Each replica's /metrics, parsed (in replica order)."""
        return [server.metrics() for server in self.servers]

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
