"""The real `vllm-router` in front of a set of vLLM servers, as a managed process: its policies, its
launcher and its start-up (lab.serving.fleet puts it in front of the replicas it starts).

    router = Router([server.url for server in servers], policy="cache_aware").start()
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lab.serving.processes import (
    ManagedProcess,
    ManagedService,
    executable_beside_python,
    free_port,
)

ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)  # vllm-router 0.1.20's --policy choices
ROUTER_HINT = "install it with `pip install vllm-router==0.1.17` (pyproject.toml declares it; `make setup` installs the lock)"


def router_executable() -> str:
    """The `vllm-router` launcher beside this Python, or on PATH."""
    found = executable_beside_python("vllm-router")
    if not found:
        raise ImportError(
            f"vllm-router is not installed for this Python ({sys.executable}); {ROUTER_HINT}"
        )
    return found


def check_policy(policy: Any) -> None:
    if policy not in ROUTER_POLICIES:
        raise ValueError(
            f"policy={policy!r}: vllm-router's policies are {', '.join(ROUTER_POLICIES)}"
        )


@dataclass(eq=False)
class Router(ManagedService):
    """The real `vllm-router` in front of `worker_urls`."""

    worker_urls: Sequence[str]
    policy: str = "cache_aware"
    args: Sequence[str] = ()  # further router flags, passed as they are
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        self.port = self.port or free_port(self.host)
        self.managed = ManagedProcess(
            "vllm-router", self.command(), f"{self.url}/health", log_prefix="vllm-router-"
        )

    def command(self) -> list[str]:
        return [
            router_executable(),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--policy",
            self.policy,
            "--prometheus-port",
            str(free_port(self.host)),
            "--worker-urls",
            *self.worker_urls,
            *self.args,
        ]

    def start(self) -> Router:
        self.managed.start(self.startup_timeout_s)
        return self

    def stop(self) -> None:
        self.managed.stop(timeout_s=10.0)

    def log_tail(self, lines: int = 40) -> str:
        return self.managed.log_tail(lines)
