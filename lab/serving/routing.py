"""Send a workload through a fleet's router and measure where it went: per request (streamed TTFT,
cached tokens) and per replica (requests served, prefix-cache queries and hits, from each replica's
/metrics read before and after the run).

    requests, replicas = route_workload(fleet, load_workload("tenants", count=64).records, Sending(concurrency=6))
    summarize_routing(requests, replicas)   # fleet hit rate, load imbalance, TTFT p50 / p99
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from lab.core.block_hash import token_hit_rate
from lab.serving.client import Sending, complete_concurrently, stream_completion
from lab.serving.fleet import Fleet
from lab.serving.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, REQUEST_SUCCESS

COUNTERS = {REQUEST_SUCCESS: "requests", PREFIX_CACHE_QUERIES: "queries", PREFIX_CACHE_HITS: "hits"}


def replica_counters(fleet: Fleet, skip_unreachable: bool = False) -> pd.DataFrame:
    """One row per replica: its cumulative request, query and hit counters (NaN for a replica that
    does not answer, when `skip_unreachable`)."""
    rows = []
    for server in fleet.servers:
        try:
            metrics = server.metrics()
        except OSError:
            if not skip_unreachable:
                raise
            metrics = {metric: float("nan") for metric in COUNTERS}
        rows.append({name: metrics.get(metric, 0.0) for metric, name in COUNTERS.items()})
    return pd.DataFrame(rows).rename_axis("replica")


def route_workload(
    fleet: Fleet,
    records: Sequence[dict],
    sending: Sending,
    *,
    tolerate_failures: bool = False,
    session_header: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Stream every record's prompt through the router as `sending` says (requests in flight, output
    tokens, resubmissions of failed streams). Returns the per-request frame (in record order;
    `error` holds a failed request's exception when `tolerate_failures`; `attempts` the sends each
    took; `sent_at` and `first_token_at` when it was first sent and when its first token came, on
    the `time.perf_counter()` clock) and the per-replica frame of counter growth over the run
    (replicas that no longer answer are left out). With `session_header` (e.g. "X-Session-ID", what
    consistent_hash keys on) every request carries its record's tenant in that header."""
    if not len(records):
        raise ValueError(
            "records is empty: pass a workload's records, e.g. load_workload('tenants').records"
        )
    if session_header is not None and any("tenant" not in r for r in records):
        raise ValueError(
            f"session_header={session_header!r} needs a 'tenant' in every record, "
            "e.g. records of the 'tenants' workload"
        )
    headers = (
        [{session_header: f"tenant-{r['tenant']}"} for r in records] if session_header else None
    )
    before = replica_counters(fleet, skip_unreachable=tolerate_failures)
    results = complete_concurrently(
        fleet.client(),
        fleet.model_name,
        [r["prompt"] for r in records],
        sending,
        return_exceptions=tolerate_failures,
        headers=headers,
    )
    replicas = (replica_counters(fleet, skip_unreachable=tolerate_failures) - before).dropna()
    requests = pd.DataFrame([_request_row(r, s) for r, s in zip(records, results)])
    return requests, replicas


def _request_row(record: dict, result) -> dict:
    if isinstance(result, Exception):
        return {"tenant": record.get("tenant"), "error": f"{type(result).__name__}: {result}"}
    return {
        "tenant": record.get("tenant"),
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "ttft_ms": result.ttft_s * 1e3,
        "e2e_ms": result.e2e_s * 1e3,
        "attempts": result.attempts,
        "first_error": result.first_error,
        "sent_at": result.started_at,
        "first_token_at": result.started_at + result.ttft_s,
        "error": None,
    }


def probe_placement(fleet: Fleet, keys: Sequence, session_header: str, max_tokens: int = 1) -> dict:
    """Where the running router sends each key: one short request per key, alone, and the replica
    whose request counter grew. For consistent_hash, whose ring hashes the replicas' URLs with the
    router's own hash."""
    placement = {}
    for key in dict.fromkeys(keys):
        before = replica_counters(fleet).requests
        stream_completion(
            fleet.client(),
            fleet.model_name,
            f"Which replica serves {key}?",
            max_tokens=max_tokens,
            headers={session_header: f"tenant-{key}"},
        )
        grew = (replica_counters(fleet).requests - before).to_numpy().nonzero()[0]
        if len(grew) != 1:
            raise RuntimeError(
                f"key {key!r}: {len(grew)} replicas counted the probe; route nothing else meanwhile"
            )
        placement[key] = int(grew[0])
    return placement


def summarize_routing(requests: pd.DataFrame, replicas: pd.DataFrame) -> pd.Series:
    """Fleet token hit rate (from the replicas' counters), load imbalance (max / mean requests per
    replica) and client-side TTFT percentiles."""
    per_replica = replicas["requests"]
    failed = (
        requests.error.notna() if "error" in requests else pd.Series(False, index=requests.index)
    )
    return pd.Series(
        {
            "requests": len(requests),
            "failed": int(failed.sum()),
            "fleet_hit_rate": token_hit_rate(replicas.hits, replicas.queries),
            "imbalance": per_replica.max() / per_replica.mean()
            if per_replica.mean()
            else float("nan"),
            "requests_per_replica": "/".join(str(int(n)) for n in per_replica),
            "p50_ttft_ms": requests.ttft_ms.quantile(0.5),
            "p99_ttft_ms": requests.ttft_ms.quantile(0.99),
        }
    )


def kv_aware_decisions(router_log: str) -> pd.DataFrame:
    """kv_aware's routing decisions from the router's debug log (`--log-level debug`): per decision,
    the prompt tokens and how many of them the router credited as already cached on the chosen
    replica (from the replicas' KV events)."""
    pattern = re.compile(
        r"KV prefix decision .*?input_tokens=(\d+) .*?credited_prefix_tokens=(\d+)"
    )
    plain = re.sub(r"\x1b\[[0-9;]*m", "", router_log)  # the router colours its log fields
    rows = [
        {"input_tokens": int(m[1]), "credited_prefix_tokens": int(m[2])}
        for m in pattern.finditer(plain)
    ]
    return pd.DataFrame(rows, columns=["input_tokens", "credited_prefix_tokens"])
