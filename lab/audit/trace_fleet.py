"""A block-hash trace across a fleet of nodes, each with its own KV pool, against one pooled cache
(Mooncake's Figure 10 question), and the eviction policies compared on one pool. Simulated: requests
are served one at a time in arrival order (no timing), every pool is a
`lab.core.chain_pool.ChainPool`.

Routing policies:
- `round_robin`: node after node;
- `random`: a seeded draw;
- `prefix_aware`: the node whose pool holds the longest cached prefix of the request (exact
  knowledge, as a router fed by KV events has); a miss, or a tie, goes to the node that has computed
  the fewest prefill tokens so far;
- `prefix_aware_balanced`: as prefix_aware, unless that node has computed more than `balance` x the
  fleet's mean prefill tokens, when the request goes to the least-loaded node instead: hits traded
  for an even load.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd

from lab.audit import cluster
from lab.audit.block_trace import BlockTrace
from lab.core.block_hash import token_hit_rate
from lab.core.chain_pool import ChainPool

ROUTING = ("round_robin", "random", "prefix_aware", "prefix_aware_balanced")


def _least_loaded(computed: list[int]) -> int:
    return min(range(len(computed)), key=computed.__getitem__)


def _choose(
    policy: str,
    pools: list[ChainPool],
    chain,
    length: int,
    computed: list[int],
    turn: int,
    rng: random.Random,
    balance: float,
) -> int:
    if policy == "round_robin":
        return turn % len(pools)
    if policy == "random":
        return rng.randrange(len(pools))
    matches = [pool.cached_blocks(chain, length) for pool in pools]
    best = max(matches)
    node = (
        _least_loaded(computed)
        if best == 0
        else min((i for i, m in enumerate(matches) if m == best), key=computed.__getitem__)
    )
    if policy == "prefix_aware_balanced" and computed[node] > balance * (
        sum(computed) / len(computed) + 1
    ):
        return _least_loaded(computed)
    return node


def route(
    trace: BlockTrace,
    nodes: int,
    kv_tokens_per_node: int,
    policy: str,
    seed: int = 0,
    balance: float = 1.5,
) -> pd.DataFrame:
    """One row per request: the node it went to and its cached tokens."""
    if policy not in ROUTING:
        raise ValueError(f"policy={policy!r}: choose one of {', '.join(ROUTING)}")
    if nodes < 1:
        raise ValueError(f"nodes={nodes!r}: a fleet needs at least one node")
    pools = [
        ChainPool(
            max(kv_tokens_per_node // trace.block_tokens, trace.longest_request_blocks),
            trace.block_tokens,
        )
        for _ in range(nodes)
    ]
    computed, rng, rows = [0] * nodes, random.Random(seed), []
    for turn, (chain, length) in enumerate(zip(trace.chains, trace.input_tokens.tolist())):
        node = _choose(policy, pools, chain, length, computed, turn, rng, balance)
        cached = pools[node].serve(chain, length)
        computed[node] += length - cached
        rows.append((node, cached))
    return pd.DataFrame(rows, columns=["node", "cached_tokens"])


def _routed(
    trace: BlockTrace, nodes: int, kv_tokens_per_node: int, seed: int, policy: str
) -> pd.DataFrame:
    return route(trace, nodes, kv_tokens_per_node, policy, seed)


def fleet_table(
    trace: BlockTrace, nodes: int, kv_tokens_per_node: int, policies=ROUTING, seed: int = 0
) -> pd.DataFrame:
    """Each routing policy over `nodes` local pools, and one pooled cache of all their tokens: the
    token hit rate, the prefill tokens computed, and the busiest node's share of that work against
    an even share. Each policy is a Ray task on a cluster (lab.audit.cluster)."""
    rows = []
    routes = cluster.map_in_order(
        _routed, policies, shared=(trace, nodes, kv_tokens_per_node, seed)
    )
    for policy, routed in zip(policies, routes):
        computed = trace.input_tokens - routed.cached_tokens.to_numpy()
        per_node = (
            pd.Series(computed).groupby(routed.node).sum().reindex(range(nodes), fill_value=0)
        )
        rows.append(
            {
                "setup": f"{nodes} local caches, {policy}",
                "hit_rate": token_hit_rate(routed.cached_tokens, trace.input_tokens),
                "prefill_tokens": int(computed.sum()),
                "busiest_node_load": per_node.max() / per_node.mean(),
            }
        )
    pooled = route(trace, 1, nodes * kv_tokens_per_node, "round_robin")
    rows.append(
        {
            "setup": f"one pooled cache of {nodes} x the tokens",
            "hit_rate": token_hit_rate(pooled.cached_tokens, trace.input_tokens),
            "prefill_tokens": int((trace.input_tokens - pooled.cached_tokens.to_numpy()).sum()),
            "busiest_node_load": np.nan,
        }
    )
    return pd.DataFrame(rows)


def eviction_table(
    trace: BlockTrace, capacities, policies=("lru", "lfu", "protect_roots")
) -> pd.DataFrame:
    """The token hit rate each eviction policy keeps on one pool at each capacity (tokens).
    `requests_changed`: the requests whose cached tokens differ from the first policy's (0: on this
    trace the policy never chose otherwise); `raised_to_admit`: the pool was raised to hold the
    longest request (no engine admits it at that capacity)."""
    longest = trace.longest_request_blocks
    rows = []
    for capacity in capacities:
        blocks = max(int(capacity) // trace.block_tokens, longest)
        served = {}
        for policy in policies:
            pool = ChainPool(blocks, trace.block_tokens, policy)
            served[policy] = np.array(
                [pool.serve(c, n) for c, n in zip(trace.chains, trace.input_tokens.tolist())]
            )
        first = served[policies[0]]
        rows += [
            {
                "kv_tokens": int(capacity),
                "policy": policy,
                "hit_rate": token_hit_rate(cached, trace.input_tokens),
                "requests_changed": int((cached != first).sum()),
                "raised_to_admit": blocks * trace.block_tokens > int(capacity),
            }
            for policy, cached in served.items()
        ]
    return pd.DataFrame(rows)
