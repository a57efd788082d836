"""The attribution checked against the real engine: the trace replayed through `vllm serve`, read
three ways.

    check = reconcile(token_ids, misses)                  # misses = lab.audit.misses.attribute(...)
    check.matching_share, check.table(), check.mismatches

1. each request's `usage.prompt_tokens_details.cached_tokens`, against the attribution's cached
   tokens;
2. the `/metrics` counters `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`, their change
   over the run;
3. vLLM's KV events (`--kv-events-config`, read back from the publisher's replay socket after the
   run): the blocks stored and removed, against the blocks the replay stored and every eviction the
   attribution blames.

Each replica's requests run on one server in turn, its prefix cache emptied in between: replicas
share nothing, so this is the fleet's behaviour replica by replica. Requests go one at a time, or
STAGGER_S apart with all of them in flight at once (each still holds its place in the order, so the
order the replay assumed is the order the engine saw: `waves`; one-token requests open the
connections first, `_open`). Every request asks for one token: a longer answer would fill and cache
more blocks than the prompt's, which the replay does not model.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pandas as pd

from lab.audit.misses import Misses
from lab.core.block_hash import kv_blocks
from lab.serving.metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES

FULL_HASHES = {
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"
}  # events carry whole hashes, as the lab computes them
LEAD_S, STAGGER_S = (
    0.1,
    0.005,
)  # a wave's first request leads by LEAD_S; the rest follow STAGGER_S apart
COUNTERS = (PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS)


@dataclass
class KVEvents:
    """The blocks an engine reported storing and removing, in order."""

    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    cleared: int = 0  # AllBlocksCleared: a reset of the prefix cache


def kv_events_args(publish_port: int, replay_port: int) -> list[str]:
    """Server flags that publish KV events over ZeroMQ and keep them for replay."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{publish_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    return ["--kv-events-config", json.dumps(config)]


def read_kv_events(replay_port: int, host: str = "127.0.0.1", timeout_s: float = 30.0) -> KVEvents:
    """Every event batch the publisher still buffers, asked for from sequence 0 on its replay
    socket."""
    import msgspec
    import zmq
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    decoder, events = msgspec.msgpack.Decoder(type=KVEventBatch), KVEvents()
    with zmq.Context() as context, context.socket(zmq.DEALER) as socket:
        socket.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        socket.connect(f"tcp://{host}:{replay_port}")
        socket.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            _, _topic, seq, payload = socket.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):  # the publisher's end-of-replay marker
                return events
            for event in decoder.decode(payload).events:
                if isinstance(event, BlockStored):
                    events.stored += event.block_hashes
                elif isinstance(event, BlockRemoved):
                    events.removed += event.block_hashes
                elif isinstance(event, AllBlocksCleared):
                    events.cleared += 1


@dataclass
class Reconciliation:
    """The attribution beside the engine's three reports (see the module docstring)."""

    requests: (
        pd.DataFrame
    )  # request, replica, predicted (the attribution's cached tokens), engine (usage),
    #                         sent_s, answered_s (on one clock)
    counters: dict[
        str, tuple[float, float]
    ]  # metric: (the run's change on /metrics, the sum over the usage)
    blocks_stored: tuple[int, int]  # (predicted by the replay, BlockStored hashes)
    evictions: tuple[int, int]  # (the replay's evictions, BlockRemoved hashes)
    blamed_evictions_in_events: tuple[
        int, int
    ]  # (evicted blocks the attribution blames, of those in BlockRemoved)
    mode: str

    @property
    def matching_share(self) -> float:
        return float((self.requests.predicted == self.requests.engine).mean())

    @property
    def mismatches(self) -> pd.DataFrame:
        return self.requests[self.requests.predicted != self.requests.engine]

    def table(self) -> pd.DataFrame:
        """One row per check: what the lab predicted, what the engine reported."""
        rows = [
            (
                "requests whose cached tokens match",
                len(self.requests),
                int((self.requests.predicted == self.requests.engine).sum()),
            )
        ]
        rows += [
            (f"{name} (change)", int(usage), int(metric))
            for name, (metric, usage) in self.counters.items()
        ]
        rows += [
            ("blocks stored (KV events)", *self.blocks_stored),
            ("blocks evicted (KV events)", *self.evictions),
            ("blamed evictions found in the events", *self.blamed_evictions_in_events),
        ]
        return pd.DataFrame(rows, columns=["check", "lab", "engine"]).assign(
            agree=lambda t: t.lab == t.engine
        )


def _open(pool, client, server, connections: int) -> None:
    """One-token requests, `connections` at once: the pool's threads and the client's connections
    exist before the first wave, so the first request of a wave is not overtaken by the next while
    it connects. They fill no block."""
    from lab.serving.client import stream_completion

    for future in [
        pool.submit(stream_completion, client, server.model_name, [1], max_tokens=1)
        for _ in range(connections)
    ]:
        future.result()


def _send_all(
    pool,
    client,
    server,
    prompts: Sequence[Sequence[int]],
    salts: Sequence[str | None],
    waves: Sequence[int],
    stagger_s: float,
    lead_s: float,
) -> list[tuple[int, float, float]]:
    """Cached tokens of each request as its usage reports them, and when it was sent and answered
    (seconds). Consecutive requests of one wave are in flight together: the first gets a lead of
    `lead_s`, the rest follow `stagger_s` apart; the next wave starts when they have all been
    answered. A failed request raises."""
    from itertools import groupby

    from lab.serving.client import stream_completion

    def send(i: int) -> tuple[int, float, float]:
        extra = {"cache_salt": salts[i]} if salts[i] else {}
        sent = time.monotonic()
        cached = stream_completion(
            client, server.model_name, list(prompts[i]), max_tokens=1, **extra
        ).cached_tokens
        return cached, sent, time.monotonic()

    cached = []
    for _, group in groupby(range(len(prompts)), key=waves.__getitem__):
        wave, futures = list(group), []
        for i in wave:
            futures.append(pool.submit(send, i))
            if len(wave) > 1:
                time.sleep(lead_s if len(futures) == 1 else stagger_s)
        cached += [future.result() for future in futures]
    return cached


def reconcile(
    token_ids: Sequence[Sequence[int]],
    misses: Misses,
    *,
    salts: Sequence[str | None] | None = None,
    waves: Sequence[int] | None = None,
    model: str | None = None,
) -> Reconciliation:
    """Replay the trace on a real `vllm serve` with the attribution's block size and KV capacity
    (one server; each replica's requests in turn, the cache emptied in between) and compare (see the
    module docstring). `waves`: one number per request; consecutive requests with the same number
    are in flight together (None: one request at a time). A wave's first request leads by LEAD_S, so
    that on a busy machine the next cannot reach the engine before it (the order is what the replay
    assumed); the rest follow STAGGER_S apart."""
    from lab.serving.metrics import parse_metrics
    from lab.serving.processes import free_port
    from lab.serving.server import VLLMServer

    salts = list(salts) if salts is not None else [None] * len(token_ids)
    if any(s is not None and not (isinstance(s, str) and s) for s in salts):
        raise ValueError(
            "salts must be non-empty strings or None (a NaN from pandas is neither: convert it to None)"
        )
    waves = list(waves) if waves is not None else list(range(len(token_ids)))
    publish_port, replay_port = free_port(), free_port()
    engine: dict[int, tuple[int, float, float]] = {}
    before_after = []
    with VLLMServer(
        model,
        block_size=misses.block_size,
        dev_endpoints=True,
        engine_args={
            "num_gpu_blocks_override": kv_blocks(misses.kv_tokens, misses.block_size) + 1,
            "max_model_len": max(map(len, token_ids)) + 1,
        },  # vLLM wants room for one
        extra_args=kv_events_args(publish_port, replay_port),
        environment=FULL_HASHES,
    ) as server:
        for _, rows in misses.requests.groupby("replica", sort=True):
            server.reset_prefix_cache()
            index = rows.request.tolist()
            client, widest = server.client(), max(Counter(waves[i] for i in index).values())
            with ThreadPoolExecutor(max_workers=widest) as pool:
                _open(pool, client, server, widest)
                first = parse_metrics(server.metrics_text())
                cached = _send_all(
                    pool,
                    client,
                    server,
                    [token_ids[i] for i in index],
                    [salts[i] for i in index],
                    [waves[i] for i in index],
                    STAGGER_S,
                    LEAD_S,
                )
            before_after.append((first, parse_metrics(server.metrics_text())))
            engine |= dict(zip(index, cached))
        events = read_kv_events(replay_port)
    answers = pd.DataFrame.from_dict(
        engine, orient="index", columns=["engine", "sent_s", "answered_s"]
    )
    requests = misses.requests[["request", "replica", "prompt_tokens"]].assign(
        predicted=misses.requests.cached_tokens
    )
    requests = requests.join(answers, on="request")
    usage = {COUNTERS[0]: requests.prompt_tokens.sum(), COUNTERS[1]: requests.engine.sum()}
    counters = {
        name: (
            sum(after.get(name, 0) - before.get(name, 0) for before, after in before_after),
            usage[name],
        )
        for name in COUNTERS
    }
    blamed = misses.evicted_hashes
    return Reconciliation(
        requests,
        counters,
        (misses.blocks_stored, len(events.stored)),
        (misses.evictions, len(events.removed)),
        (len(blamed), len(blamed & set(events.removed))),
        f"{len(set(waves))} waves for {len(waves)} requests; in a wave the first leads by "
        f"{LEAD_S * 1000:.0f} ms, the rest {STAGGER_S * 1000:.0f} ms apart",
    )
