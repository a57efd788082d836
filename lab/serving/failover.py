"""A replica killed in the middle of a routed run, and what it cost: requests resubmitted, prefill
computed again on the survivors, TTFT of the requests it hit, how long the fleet's hit rate took to
come back, and whether the replica, restarted, gets its share of traffic and hits back.

    fleet.use_policy("cache_aware", ROUTER_FAILOVER_ARGS)
    sending = Sending(concurrency=6, max_tokens=4, retry=CLIENT_RETRY)
    run = run_with_fault(fleet, records, sending, victim=1, kill_after=8)
    fault_summary(run, baseline_requests)    # sent, answered, resubmitted, extra prefill tokens, recovery ...
    rejoin(fleet, 1, records, sending)       # the victim restarted: its share of requests and of hits

Nothing is lost twice over: the router retries a send that could not reach a replica, and the lab's
client (`lab.serving.client.Retry`) resubmits a stream that broke, was refused, or ended without its
usage chunk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from lab.serving.client import Retry, Sending
from lab.serving.fleet import Fleet
from lab.serving.routing import replica_counters, route_workload

HEALTH_INTERVAL_S = 1
# The router's side of failover: a replica is checked every second and marked unhealthy at its first
# failed check (healthy again at its first good one); a send that fails is retried, on another
# replica when the policy picks one, up to 3 times, 100 ms apart and then longer. The circuit
# breaker, which stops sending to a replica after failures, tries it again after 2 s (its default,
# much longer, kept a restarted replica idle).
ROUTER_FAILOVER_ARGS = (
    "--health-check-interval-secs",
    str(HEALTH_INTERVAL_S),
    "--health-failure-threshold",
    "1",
    "--health-success-threshold",
    "1",
    "--retry-max-retries",
    "3",
    "--retry-initial-backoff-ms",
    "100",
    "--cb-timeout-duration-secs",
    "2",
)
CLIENT_RETRY = Retry(
    tries=4, backoff_s=0.5, factor=2.0
)  # up to 3.5 s of waiting: longer than a health check


@dataclass
class FaultRun:
    kill_after: int  # the victim was killed once this many requests of the run had been answered
    requests: pd.DataFrame  # route_workload's per-request frame
    replicas: pd.DataFrame  # counter growth of the replicas still up
    killed_at: float  # time.perf_counter() when the replica was killed
    router_failed_sends: int  # sends the router logged as failed (and retried) during the run


def run_with_fault(
    fleet: Fleet,
    records: Sequence[dict],
    sending: Sending,
    *,
    victim: int,
    kill_after: int,
    session_header: str | None = None,
) -> FaultRun:
    """Route `records` as `sending` says (its retry: e.g. CLIENT_RETRY, what a client would do) and
    SIGKILL replica `victim` as soon as `kill_after` of them have been answered (counted on the
    replicas' /metrics), so the fault lands at the same point of the run on a fast machine and a
    slow one."""
    if len(fleet.servers) < 2:
        raise ValueError(
            "a fault run needs at least 2 replicas: one to kill and one to take its requests"
        )
    if not 0 <= victim < len(fleet.servers):
        raise ValueError(f"victim={victim!r}: the fleet's replicas are 0..{len(fleet.servers) - 1}")
    if not 0 <= kill_after < len(records):
        raise ValueError(
            f"kill_after={kill_after!r}: kill the replica after 0..{len(records) - 1} of the "
            f"{len(records)} requests are answered"
        )
    log_before = fleet.router.log_path.read_text(errors="replace").count("Failed to send")
    answered_before = replica_counters(fleet).requests.sum()
    outcome: dict = {}

    def route() -> None:
        try:
            outcome["result"] = route_workload(
                fleet,
                records,
                replace(sending, progress=False),
                tolerate_failures=True,
                session_header=session_header,
            )
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    runner = threading.Thread(target=route)
    runner.start()
    while (
        runner.is_alive() and replica_counters(fleet).requests.sum() - answered_before < kill_after
    ):
        time.sleep(0.02)
    fleet.servers[victim].kill()
    killed_at = time.perf_counter()
    runner.join()
    if "error" in outcome:
        raise outcome["error"]
    failed_sends = (
        fleet.router.log_path.read_text(errors="replace").count("Failed to send") - log_before
    )
    return FaultRun(kill_after, *outcome["result"], killed_at, failed_sends)


def recovery_s(requests: pd.DataFrame, killed_at: float, min_hit: float = 0.5) -> float:
    """Seconds from the kill to the first token of the first request from which on (in first-token
    order) every request found at least `min_hit` of its prompt cached; 0 if no request after the
    kill missed, NaN if the run ended before the hit rate came back."""
    answered = requests[requests.error.isna()].sort_values("first_token_at")
    after = answered[answered.first_token_at >= killed_at]
    hit = (after.cached_tokens / after.prompt_tokens >= min_hit).tolist()
    if all(hit):
        return 0.0
    last_miss = len(hit) - 1 - hit[::-1].index(False)
    if last_miss == len(hit) - 1:
        return float("nan")
    return float(after.first_token_at.iloc[last_miss + 1] - killed_at)


def fault_summary(run: FaultRun, baseline: pd.DataFrame) -> dict:
    """One row for a fault run: requests sent, answered, resubmitted by the client, failed; the
    prefill tokens computed beyond `baseline` (the same records routed with no fault); median TTFT
    of the resubmitted requests and of the rest; seconds until the hit rate came back."""
    requests = run.requests
    answered = requests[requests.error.isna()]
    resubmitted = answered.attempts > 1
    computed = int((answered.prompt_tokens - answered.cached_tokens).sum())
    return {
        "kill_after_answered": run.kill_after,
        "sent": len(requests),
        "answered": len(answered),
        "resubmitted": int(resubmitted.sum()),
        "failed": len(requests) - len(answered),
        "router_retried_sends": run.router_failed_sends,
        "prefill_tokens": computed,
        "extra_prefill_tokens": computed
        - int((baseline.prompt_tokens - baseline.cached_tokens).sum()),
        "p50_ttft_ms_resubmitted": answered.ttft_ms[resubmitted].median(),
        "p50_ttft_ms_rest": answered.ttft_ms[~resubmitted].median(),
        "recovery_s": recovery_s(requests, run.killed_at),
        "requests_per_survivor": "/".join(str(int(n)) for n in run.replicas["requests"]),
    }


def rejoin(
    fleet: Fleet,
    victim: int,
    records: Sequence[dict],
    sending: Sending,
    *,
    session_header: str | None = None,
) -> tuple[pd.DataFrame, float]:
    """Restart replica `victim` (cold), give the router time to see it healthy, route `records`
    again, and return each replica's share of the requests and of the cache hits, with the restart's
    duration."""
    start = time.perf_counter()
    fleet.servers[victim].restart()
    restart_s = time.perf_counter() - start
    time.sleep(2 * HEALTH_INTERVAL_S + 0.5)  # the router's next health check marks it healthy
    requests, replicas = route_workload(
        fleet, records, replace(sending, progress=False), session_header=session_header
    )
    shares = pd.DataFrame(
        {
            "requests": replicas.requests,
            "hits": replicas.hits,
            "share_of_requests": replicas.requests / replicas.requests.sum(),
            "share_of_hits": replicas.hits / max(replicas.hits.sum(), 1.0),
        }
    )
    shares["restarted"] = shares.index == victim
    return shares, restart_s
