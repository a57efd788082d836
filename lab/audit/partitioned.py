"""The fleet's replay, one task per replica: past one machine.

Each replica has its own KV pool, so once every request's replica is known, each replica's requests are a stream
that no other stream touches. Under consistent hashing of the tenant (vllm-router's `consistent_hash` with the
tenant as the session key) the replica depends on the request alone, so the streams can be cut before any replay
and replayed anywhere: here as Dask tasks, on whatever cluster the `client` given is connected to (a local one
in the tests; `dask-scheduler` and `dask-worker` on several machines take the same code). Without a client, the
same tasks run one after another in this process, and the two results are equal. (The replay's hashes are the
lab's own, seeded by nothing in the environment; a Dask nanny sets PYTHONHASHSEED in the process that starts it,
which changes what `lab.core.block_hash` computes afterwards there, as it changes vLLM's.)

    from dask.distributed import Client, LocalCluster
    with Client(LocalCluster(n_workers=2)) as client:
        cached = fleet_replay(trace, replicas=4, block_size=32, kv_tokens=100_000, client=client)
"""

from __future__ import annotations

import numpy as np

from lab.audit.replay import replay_chains
from lab.audit.trace import Trace
from lab.checks import positive_int
from lab.core.block_hash import kv_blocks
from lab.experiments.fleet_sim import FleetSim


def tenant_routes(tenants: list[str | None], replicas: int, seed: int = 0) -> np.ndarray:
    """Each request's replica under the simulator's consistent hashing of its tenant (requests without a tenant
    hash their position, as a router hashes a body it has no key for)."""
    ring = FleetSim(replicas, "consistent_hash", kv_blocks=1, block_size=1, seed=seed)
    return np.array([ring.replica_for_key(tenant if tenant is not None else ("request", i))
                     for i, tenant in enumerate(tenants)], dtype=np.int64)


def fleet_replay(trace: Trace, replicas: int, block_size: int, kv_tokens: int, client=None) -> np.ndarray:
    """Each request's cached tokens when the log is routed by tenant onto `replicas` replicas of `kv_tokens` each,
    every replica replaying its own requests in arrival order: one task per replica, on `client`'s Dask cluster,
    or in this process when there is none."""
    positive_int("replicas", replicas, "the number of replicas, e.g. 4")
    routes = tenant_routes(trace.tenants, replicas)
    streams = [[] for _ in range(replicas)]
    for replica, hashes in zip(routes.tolist(), trace.chains(block_size)):
        streams[replica].append(hashes)
    lengths = [trace.lengths[routes == r].tolist() for r in range(replicas)]
    num_blocks = kv_blocks(kv_tokens, block_size)
    if client is None:
        results = [replay_chains(streams[r], lengths[r], block_size, num_blocks) for r in range(replicas)]
    else:
        futures = [client.submit(replay_chains, streams[r], lengths[r], block_size, num_blocks, pure=False)
                   for r in range(replicas)]
        results = client.gather(futures)
    cached = np.zeros(trace.requests, dtype=np.int64)
    for r, result in enumerate(results):
        cached[routes == r] = result
    return cached
