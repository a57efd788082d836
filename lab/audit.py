"""Audit your own prompts: what prefix caching will do for them, what breaks their sharing, and what to change.

    python -m lab.audit prompts.jsonl --replicas 4          # terminal summary, HTML + JSON report in figures/
    result = audit("prompts.jsonl", replicas=4)             # the same from a notebook: result.summary, ...

PROMPTS is JSONL: one request per line, `{"prompt": "..."}` or `{"messages": [...]}` (rendered with the
model's chat template), optionally with `arrival_s` (seconds; requests are replayed in that order) and
`tenant` (or `user`). Every hit rate below is measured by replaying the token ids through the lab's
`PrefixCache` (vLLM V1's block pool) of a stated capacity, one request at a time in arrival order; the TTFT
and throughput change is a projection from the lab's measured gain-vs-hit-rate curve, and a short run on the
real engine confirms it on a sample.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lab.engine_settings import accepted_block_sizes
from lab.fleet_sim import POLICIES, CacheAwareKnobs, FleetSim, summarize_sim
from lab.prefix_cache import PrefixCache
from lab.radix_cache import RadixCache

DEFAULT_KV_TOKENS = 100_000  # set --kv-tokens to your engine's: vLLM logs "KV cache size: N tokens" at start


class AuditInputError(ValueError):
    """A prompts file, or a line in it, that cannot be audited; the message names the file, the line and a fix."""


@dataclass
class Prompts:
    """What was read: texts and token ids in replay order, each line's number, optional tenants."""

    path: str
    texts: list[str]
    token_ids: list[list[int]]
    lines: list[int]
    tenants: list[str | None]
    skipped: list[str] = field(default_factory=list)  # one message per bad line skipped with skip_bad


# --------------------------------------------------------------------------------------------- reading

def load_tokenizer(model: str | None):
    """The tokenizer of `model` (a local Hugging Face model directory; None: the lab's model)."""
    from transformers import AutoTokenizer

    from lab.engine_settings import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(model))
    except Exception as error:  # transformers raises OSError, ValueError or its own errors
        raise AuditInputError(f"--model {model}: cannot load a tokenizer from it ({type(error).__name__}: {error}); "
                              "pass a local Hugging Face model directory with tokenizer files, or leave --model "
                              "out to use the lab's model") from error


def _record_text(record: object, tokenizer, where: str) -> tuple[str, bool]:
    """The prompt text of one record, and whether the model's chat template rendered it."""
    if not isinstance(record, dict) or not ("prompt" in record or "messages" in record):
        raise AuditInputError(f"{where}: has neither 'prompt' nor 'messages'; write "
                              '{"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}')
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise AuditInputError(f"{where}: 'prompt' must be a non-empty string")
        return record["prompt"], False
    messages = record["messages"]
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise AuditInputError(f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}}")
    if not getattr(tokenizer, "chat_template", None):
        raise AuditInputError(f"{where}: 'messages' needs a chat template, and this model's tokenizer has none; "
                              "send rendered prompts as 'prompt', or choose a chat model with --model")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True


def _parse_lines(path: Path, tokenizer, skip_bad: bool) -> tuple[list[dict], list[str]]:
    """One entry per good line: text, line number, arrival time, tenant, and whether it is a chat."""
    good, skipped = [], []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise AuditInputError(f"{where}: not JSON ({error.msg}); each line must be one object, e.g. "
                                          '{"prompt": "..."}') from error
                text, chat = _record_text(record, tokenizer, where)
                arrival = record.get("arrival_s")
                if arrival is not None and not isinstance(arrival, (int, float)):
                    raise AuditInputError(f"{where}: 'arrival_s' must be a number of seconds, not {arrival!r}")
                tenant = record.get("tenant", record.get("user"))
                good.append({"text": text, "line": number, "arrival_s": arrival, "chat": chat,
                             "tenant": None if tenant is None else str(tenant)})
            except AuditInputError as error:
                if not skip_bad:
                    raise AuditInputError(f"{error} (--skip-bad skips bad lines and counts them)") from None
                skipped.append(str(error))
    return good, skipped


def read_prompts(path: str | Path, tokenizer, *, max_model_len: int | None = None, skip_bad: bool = False,
                 progress: bool = True) -> Prompts:
    """Read and tokenize a JSONL prompts file, in arrival order when it gives arrival times. Bad lines raise
    AuditInputError naming the file and line, or with `skip_bad` are skipped and listed in `skipped`."""
    from tqdm.auto import tqdm

    path = Path(path)
    if not path.is_file():
        raise AuditInputError(f"{path}: no such file; pass a JSONL file of prompts, one {{\"prompt\": ...}} per line")
    good, skipped = _parse_lines(path, tokenizer, skip_bad)
    if not good:
        reason = f"all {len(skipped)} lines are bad" if skipped else "it is empty"
        raise AuditInputError(f"{path}: nothing to audit, {reason}; write one JSON object per line, "
                              'e.g. {"prompt": "You are a support bot. ..."}')
    if any(g["arrival_s"] is not None for g in good):
        good.sort(key=lambda g: (g["arrival_s"] is None, g["arrival_s"] or 0.0))
    token_ids = []
    for start in tqdm(range(0, len(good), 1000), desc="tokenizing", unit="k prompts", disable=not progress, leave=False):
        batch = good[start:start + 1000]
        plain = tokenizer([g["text"] for g in batch if not g["chat"]])["input_ids"] if any(not g["chat"] for g in batch) else []
        chats = tokenizer([g["text"] for g in batch if g["chat"]], add_special_tokens=False)["input_ids"] \
            if any(g["chat"] for g in batch) else []
        plain, chats = iter(plain), iter(chats)
        token_ids += [next(chats) if g["chat"] else next(plain) for g in batch]
    limit = max_model_len or getattr(tokenizer, "model_max_length", None)
    kept = []
    for g, ids in zip(good, token_ids):
        if limit and len(ids) > limit:
            message = (f"{path}:{g['line']}: {len(ids)} tokens, longer than the model's context of {limit}; shorten "
                       "it, or audit with a model whose context holds it (--model)")
            if not skip_bad:
                raise AuditInputError(message + " (--skip-bad skips bad lines and counts them)")
            skipped.append(message)
            continue
        kept.append((g, ids))
    if not kept:
        raise AuditInputError(f"{path}: nothing to audit, every prompt is longer than the model's context of {limit}")
    return Prompts(str(path), [g["text"] for g, _ in kept], [ids for _, ids in kept], [g["line"] for g, _ in kept],
                   [g["tenant"] for g, _ in kept], skipped)


# --------------------------------------------------------------------------------------------- hit rates

def replay_hit_rate(token_ids: Sequence[Sequence[int]], block_size: int, kv_tokens: int,
                    salts: Sequence[str | None] | None = None) -> float:
    """Token hit rate of the prompts replayed one at a time, in order, through one `PrefixCache` holding
    `kv_tokens` tokens (least recently used blocks evicted first, as in vLLM)."""
    cache = PrefixCache(num_blocks=max(kv_tokens // block_size, 1), block_size=block_size)
    cached = 0
    for i, ids in enumerate(token_ids):
        cached += cache.allocate(str(i), ids, cache_salt=salts[i] if salts else None)
        cache.free(str(i))
    return cached / sum(map(len, token_ids))


def radix_hit_rate(token_ids: Sequence[Sequence[int]], kv_tokens: int) -> float:
    """The same replay through a token-granular radix tree of the same capacity: what blocks cost."""
    cache = RadixCache(capacity_tokens=kv_tokens)
    cached = 0
    for i, ids in enumerate(token_ids):
        cached += cache.allocate(str(i), ids)
        cache.free(str(i))
    return cached / sum(map(len, token_ids))


def check_capacity(token_ids: Sequence[Sequence[int]], kv_tokens: int, lines: Sequence[int], path: str) -> None:
    longest = max(range(len(token_ids)), key=lambda i: len(token_ids[i]))
    if len(token_ids[longest]) + 128 > kv_tokens:
        raise AuditInputError(f"kv_tokens={kv_tokens} cannot hold {path}:{lines[longest]} ({len(token_ids[longest])} "
                              "tokens) with room for a block per size; use your engine's KV capacity, which vLLM logs at "
                              "start ('KV cache size: N tokens')")


# --------------------------------------------------------------------------------------------- what breaks sharing

@dataclass
class Field:
    """A line where prompts of one template first differ: its label, what its values look like, how many
    prompts diverge there, where (tokens into the prompt) and the hit rate with the line moved to the end."""

    label: str
    kind: str
    examples: list[str]
    prompts: int
    median_token_position: int
    hit_rate_before: float
    hit_rate_after: float


KINDS = [("timestamp", r"\d{1,2}:\d{2}(:\d{2})?|\d{4}-\d{2}-\d{2}|\b\d{10,13}\b"),
         ("identifier", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-|\b(?=[A-Za-z_-]*\d)[0-9A-Za-z_-]{8,}\b"),
         ("number", r"\b\d+(\.\d+)?\b"),
         ("name", r"^\W*[A-Z][a-z]+( [A-Z][a-z]+)?\W*$")]


def value_kind(value: str) -> str:
    """What a field's value looks like: timestamp, identifier, number, name, or text."""
    for kind, pattern in KINDS:
        if re.search(pattern, value):
            return kind
    return "text"


def _common_prefix_length(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality: C-speed comparisons
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def divergence_points(texts: Sequence[str]) -> list[int]:
    """Per prompt, where it stops sharing with the prompt most like it: the longest common prefix with any
    other prompt, which is always with a neighbour in sorted order."""
    order = sorted(range(len(texts)), key=texts.__getitem__)
    points = [0] * len(texts)
    for a, b in zip(order, order[1:]):
        shared = _common_prefix_length(texts[a], texts[b])
        points[a], points[b] = max(points[a], shared), max(points[b], shared)
    return points


def _line_at(text: str, position: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return start, len(text) if end == -1 else end


def _label(line_prefix: str) -> str:
    """A field's name: the fixed text of its line up to its label's colon, or the words before the value."""
    colon = line_prefix.find(":")
    if colon != -1 and not re.search(r"\d", line_prefix[:colon]):
        return line_prefix[:colon + 1]
    return re.split(r"[\d\W]*$", line_prefix)[0] or "(start of line)"


def move_line_to_end(text: str, label: str) -> str:
    """The prompt with its first line that starts with `label` moved to the end (unchanged if it has none,
    or if that line is already last)."""
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):
        if line.startswith(label):
            return "\n".join(lines[:i] + lines[i + 1:] + [line])
    return text


def find_breaking_field(texts: Sequence[str], min_share: float = 0.2,
                        moved: Sequence[str] = ()) -> tuple[str, str, list[str], list[str]] | None:
    """The most common line label at which prompts diverge, among lines that are not already the prompt's
    last (a field at the end breaks nothing, nor one followed only by lines already `moved` there); None when
    no label covers `min_share` of the prompts. Returns
    the label, the kind of its values, up to three example values, and each diverging prompt's text up to
    the divergence."""
    found: Counter[str] = Counter()
    values: dict[str, list[str]] = {}
    where: dict[str, list[str]] = {}
    for text, point in zip(texts, divergence_points(texts)):
        start, end = _line_at(text, point)
        if point >= len(text) or all(line.startswith(tuple(moved)) for line in text[end + 1:].split("\n") if line):
            continue
        label = _label(text[start:point])
        found[label] += 1
        values.setdefault(label, []).append(text[start + len(label):end].strip())
        where.setdefault(label, []).append(text[:point])
    if not found:
        return None
    label, count = found.most_common(1)[0]
    if count < min_share * len(texts):
        return None
    examples = list(dict.fromkeys(values[label]))[:3]
    return label, Counter(map(value_kind, values[label])).most_common(1)[0][0], examples, where[label]


def where_prompts_diverge(texts: Sequence[str], top: int = 3) -> dict:
    """Where prompts stop sharing with the prompt most like them: the median share of a prompt's characters
    that come before that point, and the most common line labels there (with the number of prompts)."""
    points = divergence_points(texts)
    labels = Counter(_label(t[_line_at(t, p)[0]:p]) for t, p in zip(texts, points) if p < len(t))
    return {"median_shared_fraction": float(np.median([p / len(t) for t, p in zip(texts, points)])),
            "labels": [{"label": label, "prompts": n} for label, n in labels.most_common(top)]}


def breaking_fields(texts: Sequence[str], tokenizer, block_size: int, kv_tokens: int, max_fields: int = 3,
                    min_gain: float = 0.01) -> list[Field]:
    """Find the line where prompts first diverge, move it to the end of every prompt, replay, and repeat up to
    `max_fields` times (a second field right behind the first hides the first one's gain until both have
    moved). Each field comes with the hit rate before and after its move; moves after the last one that
    raised the hit rate by `min_gain` are dropped."""
    fields: list[Field] = []
    current = list(texts)
    before = replay_hit_rate(_encode(tokenizer, current), block_size, kv_tokens)
    for _ in range(max_fields):
        found = find_breaking_field(current, moved=[f.label for f in fields])
        if found is None:
            break
        label, kind, examples, heads = found
        current = [move_line_to_end(t, label) for t in current]
        after = replay_hit_rate(_encode(tokenizer, current), block_size, kv_tokens)
        position = int(np.median([len(ids) for ids in tokenizer(heads[:50])["input_ids"]]))
        fields.append(Field(label, kind, examples, len(heads), position, before, after))
        before = after
    while fields and fields[-1].hit_rate_after < max([fields[0].hit_rate_before] +
                                                     [f.hit_rate_after for f in fields[:-1]]) + min_gain:
        fields.pop()
    return fields


def _encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [ids for start in range(0, len(texts), 1000) for ids in tokenizer(list(texts[start:start + 1000]))["input_ids"]]


# --------------------------------------------------------------------------------------------- projection

def gain_curve() -> tuple[pd.DataFrame, dict]:
    """The lab's measured throughput gain and TTFT change against the token hit rate: notebook 10's latest
    results, from the results folder in use, else from the project's committed data/results/."""
    from lab import PROJECT_ROOT
    from lab.results import load_latest

    try:
        return load_latest("10_capacity-gain")
    except FileNotFoundError:
        pass
    try:
        return load_latest("10_capacity-gain", PROJECT_ROOT / "data" / "results")
    except FileNotFoundError as error:
        raise FileNotFoundError("no 10_capacity-gain results to project from: run notebooks/10_capacity.ipynb "
                                "(make run) first") from error


def project(hit_rate: float, curve: pd.DataFrame) -> dict:
    """Throughput gain and mean TTFT change at `hit_rate`, interpolated along the measured curve (its
    ends held beyond the measured range, and said so)."""
    curve = curve.sort_values("hit_rate")
    rates = curve.hit_rate.to_numpy(float)
    return {"hit_rate": hit_rate,
            "throughput_gain": float(np.interp(hit_rate, rates, curve.throughput_gain.to_numpy(float))),
            "ttft_change": float(np.interp(hit_rate, rates, curve.ttft_change.to_numpy(float))),
            "within_measured_range": bool(rates.min() <= hit_rate <= rates.max())}


def confirm_on_engine(token_ids: Sequence[Sequence[int]], model: str | None, block_size: int, sample: int,
                      max_tokens: int = 8) -> dict:
    """A short measured run on the real vLLM engine: the first `sample` prompts in order, submitted at once
    with caching off and then on (a fresh engine each, warmed on the same prompts, cache emptied)."""
    from lab.capacity import _warm_engine
    from lab.measure import run_workload, summarize

    prompts = [list(ids) for ids in token_ids[:sample]]
    summaries = {}
    for caching in (False, True):
        llm = _warm_engine(model, caching, block_size, prompts, max_tokens)
        summaries[caching] = summarize(run_workload(llm, prompts, max_tokens=max_tokens, mode="offline", progress=False))
        del llm
    off, on = summaries[False], summaries[True]
    return {"prompts": len(prompts), "hit_rate": float(on["hit_rate"]),
            "throughput_gain": float(on["requests_per_s"] / off["requests_per_s"]),
            "ttft_change": float(on["mean_ttft_ms"] / off["mean_ttft_ms"] - 1),
            "mean_ttft_ms_off": float(off["mean_ttft_ms"]), "mean_ttft_ms_on": float(on["mean_ttft_ms"])}


# --------------------------------------------------------------------------------------------- fleet and tenants

THRESHOLDS = (0.3, 0.5, 0.8)  # cache_aware --cache-threshold values tried


def fleet_policies(token_ids: Sequence[Sequence[int]], tenants: Sequence[str | None], replicas: int, block_size: int,
                   kv_tokens: int, max_imbalance: float = 1.5, progress: bool = False) -> tuple[pd.DataFrame, str]:
    """Every router policy (cache_aware at several cache thresholds) simulated over `replicas` replicas
    of `kv_tokens` each, with 2 requests per replica in flight; the recommendation is the highest hit rate
    whose load imbalance (max / mean requests) stays within `max_imbalance`."""
    from tqdm.auto import tqdm

    keys = list(tenants) if all(t is not None for t in tenants) else None
    runs = [(policy, threshold) for policy in POLICIES for threshold in (THRESHOLDS if policy == "cache_aware" else (None,))]
    rows = []
    for policy, threshold in tqdm(runs, desc="simulating policies", disable=not progress, leave=False):
        knobs = CacheAwareKnobs(cache_threshold=threshold) if threshold is not None else None
        sim = FleetSim(replicas, policy, kv_blocks=kv_tokens // block_size, block_size=block_size, knobs=knobs)
        s = summarize_sim(sim.run(token_ids, concurrency=2 * replicas,
                                  keys=keys if policy == "consistent_hash" else None), replicas)
        name = policy if threshold is None else f"cache_aware --cache-threshold {threshold}"
        rows.append({"policy": name, "fleet_hit_rate": s.fleet_hit_rate, "imbalance": s.imbalance,
                     "session_key": "tenant" if policy == "consistent_hash" and keys else ""})
    table = pd.DataFrame(rows)
    if table.fleet_hit_rate.max() < 0.01:  # nothing to share: only the load matters
        return table, "round_robin"
    balanced = table[table.imbalance <= max_imbalance]
    best = (balanced if len(balanced) else table).sort_values("fleet_hit_rate", ascending=False, kind="stable")
    return table, best.policy.iloc[0]


def salt_cost(token_ids: Sequence[Sequence[int]], tenants: Sequence[str | None], block_size: int,
              kv_tokens: int) -> dict | None:
    """Hit rate with and without a per-tenant `cache_salt` (which closes the timing side channel between
    tenants, and stops them sharing); None without tenants."""
    if not any(t is not None for t in tenants):
        return None
    shared = replay_hit_rate(token_ids, block_size, kv_tokens)
    salted = replay_hit_rate(token_ids, block_size, kv_tokens, salts=list(tenants))
    return {"tenants": len(set(tenants)), "hit_rate_shared": shared, "hit_rate_salted": salted, "cost": shared - salted}


# --------------------------------------------------------------------------------------------- the audit

@dataclass
class AuditResult:
    summary: dict
    hit_rates: pd.DataFrame
    fields: list[Field]
    fleet: pd.DataFrame


def _sample(prompts: Prompts, size: int) -> tuple[list[str], list[list[int]], list[str | None]]:
    """The first `size` prompts (arrival order is what the cache sees, so a sample keeps it)."""
    return prompts.texts[:size], prompts.token_ids[:size], prompts.tenants[:size]


def audit(path: str | Path, *, model: str | None = None, kv_tokens: int = DEFAULT_KV_TOKENS,
          block_sizes: Sequence[int] | None = None, replicas: int = 4, confirm: int = 32, field_sample: int = 2000,
          fleet_sample: int = 20_000, skip_bad: bool = False, progress: bool = True) -> AuditResult:
    """Every section of the report for one prompts file (see the module docstring). `confirm` prompts run
    on the real engine (0: no engine); the field search and the fleet simulation use the first
    `field_sample` and `fleet_sample` prompts, and say so."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas={replicas!r}: use a positive number of replicas, e.g. 4")
    if isinstance(kv_tokens, bool) or not isinstance(kv_tokens, int) or kv_tokens < 1:
        raise ValueError(f"kv_tokens={kv_tokens!r}: use your engine's KV capacity in tokens, e.g. 100000")
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = round(time.perf_counter() - clock, 2)
        clock = time.perf_counter()

    from tqdm.auto import tqdm

    tokenizer = load_tokenizer(model)
    prompts = read_prompts(path, tokenizer, skip_bad=skip_bad, progress=progress)
    check_capacity(prompts.token_ids, kv_tokens, prompts.lines, prompts.path)
    lap("read and tokenize")
    sizes = list(block_sizes or accepted_block_sizes())
    rates = {size: replay_hit_rate(prompts.token_ids, size, kv_tokens)
             for size in tqdm(sizes, desc="replaying per block size", disable=not progress, leave=False)}
    radix = radix_hit_rate(prompts.token_ids, kv_tokens)
    hit_rates = pd.DataFrame({"cache": [f"blocks of {s}" for s in sizes] + ["radix tree (token-granular)"],
                              "block_size": sizes + [1], "hit_rate": list(rates.values()) + [radix]})
    best_size = max(sizes, key=lambda s: (round(rates[s], 3), s))  # ties: the larger block
    lap("hit rates")
    texts, ids, tenants = _sample(prompts, field_sample)
    divergence = where_prompts_diverge(texts)
    fields = breaking_fields(texts, tokenizer, best_size, kv_tokens)
    lap("what breaks sharing")
    curve, curve_meta = gain_curve()
    projection = project(rates[best_size], curve)
    if fields:
        projection["after_moving_fields"] = project(fields[-1].hit_rate_after, curve)
    confirmation = confirm_on_engine(prompts.token_ids, model, best_size, confirm) if confirm else None
    if confirmation:
        confirmation["projected"] = project(confirmation["hit_rate"], curve)
    lap("projection and confirmation")
    _, fleet_ids, fleet_tenants = _sample(prompts, fleet_sample)
    fleet, recommended = fleet_policies(fleet_ids, fleet_tenants, replicas, best_size, kv_tokens, progress=progress)
    lap("fleet")
    salt = salt_cost(prompts.token_ids, prompts.tenants, best_size, kv_tokens)
    lap("tenant salt")
    lengths = pd.Series(list(map(len, prompts.token_ids)))
    summary = {
        "file": prompts.path, "prompts": len(prompts.token_ids), "skipped_lines": len(prompts.skipped),
        "skipped": prompts.skipped[:20], "tokenizer": str(model or "the lab's model"),
        "prompt_tokens": {"mean": float(lengths.mean()), "p50": float(lengths.median()), "max": int(lengths.max())},
        "kv_tokens": kv_tokens, "replay": "one request at a time, in arrival order, least recently used evicted first",
        "hit_rate_by_block_size": {int(s): r for s, r in rates.items()}, "radix_hit_rate": radix,
        "recommended_block_size": best_size,
        "divergence": divergence, "fields": [vars(f) for f in fields], "field_sample": len(texts),
        "projection": projection | {"source": curve_meta["run_id"], "measured_on": curve_meta["environment"]["device"],
                                    "note": "a projection from the lab's curve, not a measurement of these prompts"},
        "confirmation": confirmation,
        "fleet": {"replicas": replicas, "sample": len(fleet_ids), "recommended_policy": recommended,
                  "policies": fleet.to_dict("records")},
        "tenant_salt": salt, "seconds": timings,
    }
    return AuditResult(summary, hit_rates, fields, fleet)


def terminal_summary(summary: dict) -> str:
    """A short plain-text summary of an audit."""
    s = summary
    rates = ", ".join(f"{size}: {rate:.1%}" for size, rate in s["hit_rate_by_block_size"].items())
    lines = [f"{s['file']}: {s['prompts']:,} prompts ({s['skipped_lines']} bad lines skipped), "
             f"{s['prompt_tokens']['mean']:.0f} tokens on average; KV capacity {s['kv_tokens']:,} tokens",
             f"  token hit rate by block size: {rates}; radix tree {s['radix_hit_rate']:.1%}",
             f"  recommended block size: {s['recommended_block_size']}"]
    for f in s["fields"]:
        lines.append(f"  breaks sharing: '{f['label']}' ({f['kind']}, e.g. {f['examples'][0]!r}) about "
                     f"{f['median_token_position']} tokens in, in {f['prompts']} prompts; moved to the end: "
                     f"{f['hit_rate_before']:.1%} -> {f['hit_rate_after']:.1%}")
    d = s["divergence"]
    where = ", ".join(f"'{x['label']}' ({x['prompts']})" for x in d["labels"])
    lines.insert(3, f"  prompts share a median {d['median_shared_fraction']:.0%} of their text with their closest "
                    f"neighbour before diverging, most often at: {where}")
    if not s["fields"]:
        lines.append("  breaks sharing: no field whose move to the end raises the hit rate by a point or more")
    p = s["projection"]
    lines.append(f"  projection (lab curve {p['source']}, {p['measured_on']}): throughput x{p['throughput_gain']:.2f}, "
                 f"mean TTFT {p['ttft_change']:+.0%}" + ("" if p["within_measured_range"] else " (outside the measured range)")
                 + (f"; after moving the fields: x{a['throughput_gain']:.2f}, {a['ttft_change']:+.0%}"
                    if (a := p.get("after_moving_fields")) else ""))
    if c := s["confirmation"]:
        lines.append(f"  measured on the engine, first {c['prompts']} prompts: hit rate {c['hit_rate']:.1%}, "
                     f"throughput x{c['throughput_gain']:.2f}, mean TTFT {c['ttft_change']:+.0%} (the curve projects "
                     f"x{c['projected']['throughput_gain']:.2f}, {c['projected']['ttft_change']:+.0%} at that hit rate)")
    fl = s["fleet"]
    best = next(r for r in fl["policies"] if r["policy"] == fl["recommended_policy"])
    lines.append(f"  {fl['replicas']} replicas (simulated, {fl['sample']:,} prompts): recommended "
                 f"{fl['recommended_policy']} at {best['fleet_hit_rate']:.1%}, imbalance {best['imbalance']:.2f}")
    if t := s["tenant_salt"]:
        lines.append(f"  per-tenant cache_salt ({t['tenants']} tenants): hit rate {t['hit_rate_shared']:.1%} -> "
                     f"{t['hit_rate_salted']:.1%}")
    lines.append("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in s["seconds"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from lab.audit_report import write_report

    parser = argparse.ArgumentParser(prog="python -m lab.audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", help="JSONL file: one {\"prompt\": ...} or {\"messages\": [...]} per line")
    parser.add_argument("--model", help="local Hugging Face model directory for the tokenizer (default: the lab's)")
    parser.add_argument("--kv-tokens", type=int, default=DEFAULT_KV_TOKENS, help="KV cache capacity in tokens")
    parser.add_argument("--block-sizes", type=int, nargs="+", help="default: the sizes this back-end accepts")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--confirm", type=int, default=32, help="prompts run on the real engine (0: none)")
    parser.add_argument("--skip-bad", action="store_true", help="skip and count bad lines instead of stopping")
    parser.add_argument("--out", help="report folder (default: figures/)")
    args = parser.parse_args(argv)
    try:
        result = audit(args.prompts, model=args.model, kv_tokens=args.kv_tokens, block_sizes=args.block_sizes,
                       replicas=args.replicas, confirm=args.confirm, skip_bad=args.skip_bad)
    except (AuditInputError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(terminal_summary(result.summary))
    for written in write_report(result, args.out):
        print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
