"""How to audit a log: every choice `audit()` and `python -m lab.audit` take, declared once, checked
once.

    settings = AuditSettings(kv_tokens=200_000, replicas=8)     # a bad value raises here, naming it
    result = audit("prompts.jsonl", settings)
    result = audit("prompts.jsonl", replicas=8)                # the same: audit() builds the settings

The command line's defaults are these fields' defaults (lab.audit.__main__ reads them from here).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from lab.checks import positive_int

DEFAULT_KV_TOKENS = (
    100_000  # set --kv-tokens to your engine's: vLLM logs "KV cache size: N tokens" at start
)
RENAMED = {"fleet_sample": "explained"}  # old keyword -> its name now


class SettingsError(ValueError):
    """A setting that cannot be audited with; `name` is the setting (the flag is `--` and its dashed
    name)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _whole(name: str, value, what: str, minimum: int = 1) -> None:
    try:
        positive_int(name, value, what, minimum)
    except ValueError as error:
        raise SettingsError(name, str(error)) from None


@dataclass(frozen=True)
class AuditSettings:
    """Every choice of an audit. The hit rates per block size, the replay over time and the
    per-tenant salt cover every request; the causes of the misses, the fleet simulation and the
    projection the first `explained` requests in arrival order, and the field search and the
    prefix-breakers (each fix replayed) the first `field_sample`."""

    model: str | os.PathLike | None = (
        None  # a local Hugging Face model directory for the tokenizer (None: the lab's)
    )
    kv_tokens: int = DEFAULT_KV_TOKENS  # the KV cache's capacity in tokens (per replica)
    block_sizes: tuple[int, ...] | None = None  # None: the sizes this back-end accepts
    replicas: int = 4  # the simulated fleet's size
    confirm: int = 0  # prompts run on the real engine, caching off and on (0: no engine is started)
    output_tokens: int = 8  # the answer length the projection assumes
    explained: int = (
        5_000  # the first requests (arrival order) whose misses are explained and routed on a fleet
    )
    field_sample: int = (
        2_000  # the first requests searched for fields and other prefix-breakers, fixes replayed on
    )
    workers: int = 1  # processes that read the log (with `ray` "local": the local cluster's CPUs)
    ray: str | None = (
        # None: this machine alone; "local": a Ray cluster started here; else a cluster's address
        None
    )
    skip_bad: bool = False  # skip and count bad lines instead of stopping at the first
    progress: bool = True  # progress bars

    def __post_init__(self) -> None:
        for name, example in (
            ("kv_tokens", "your engine's KV capacity, 100000"),
            ("replicas", "4"),
            ("output_tokens", "8"),
            ("explained", "5000"),
            ("field_sample", "2000"),
            ("workers", "1, or the number of cores"),
        ):
            _whole(name, getattr(self, name), f"a positive whole number, e.g. {example}")
        _whole(
            "confirm",
            self.confirm,
            "a whole number of prompts to run on the engine, e.g. 32 (0: no engine)",
            0,
        )
        for name in ("skip_bad", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise SettingsError(name, f"{name}={getattr(self, name)!r} must be True or False")
        if self.ray is not None and (not isinstance(self.ray, str) or not self.ray.strip()):
            raise SettingsError(
                "ray",
                f'ray={self.ray!r} must be "local" (a cluster on this machine) or a Ray '
                'cluster\'s address, e.g. "auto" or "ray://head:10001"',
            )
        if self.model is not None and not isinstance(self.model, str | os.PathLike):
            raise SettingsError(
                "model",
                f"model={self.model!r} must be a local model directory (a path), or None "
                "for the lab's model",
            )
        object.__setattr__(self, "block_sizes", _block_sizes(self.block_sizes))

    @classmethod
    def build(cls, base: AuditSettings | None = None, **overrides) -> AuditSettings:
        """`base` (default: every default) with `overrides` in place of its fields; an unknown name
        raises, naming the settings there are."""
        if base is not None and not isinstance(base, cls):
            raise TypeError(
                f"settings={base!r} must be an AuditSettings, e.g. AuditSettings(replicas=4), or None"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            renamed = "".join(f"; {old} is now {RENAMED[old]}" for old in unknown if old in RENAMED)
            raise TypeError(
                f"unknown audit setting {', '.join(unknown)}{renamed}; the settings are "
                f"{', '.join(sorted(names))}"
            )
        return dataclasses.replace(base, **overrides) if base is not None else cls(**overrides)


def _block_sizes(sizes) -> tuple[int, ...] | None:
    """The block sizes as a tuple, each once, in the order given (None stays None: the back-end's)."""
    if sizes is None:
        return None
    if isinstance(sizes, int | str | bytes) or not hasattr(sizes, "__iter__"):
        raise SettingsError(
            "block_sizes",
            f"block_sizes={sizes!r} must be a list of block sizes, e.g. [16, 32], "
            "or None for the sizes this back-end accepts",
        )
    sizes = tuple(dict.fromkeys(sizes))
    if not sizes:
        raise SettingsError(
            "block_sizes",
            "block_sizes=[] names no size; give at least one, e.g. [32], or None "
            "for the sizes this back-end accepts",
        )
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SettingsError(
                "block_sizes",
                f"block_sizes={list(sizes)!r} holds {size!r}: each must be a positive "
                "whole number of tokens, e.g. [16, 32]",
            )
    return sizes
