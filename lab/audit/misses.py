"""Why did it miss? Every prompt token that is not served from cache gets exactly one cause.

    misses = attribute(token_ids, block_size=32, kv_tokens=100_000)            # one engine
    misses = attribute(token_ids, block_size=32, kv_tokens=8_000, salts=tenants, routes=Routes(replica_of, 4))
    misses.totals          # tokens per cause; they add up to the uncached tokens, exactly
    misses.requests        # one row per request: cached tokens, tokens per cause, where it diverged

The trace is replayed one request at a time, in order, through one `PrefixCache` per replica (vLLM
V1's block pool, least recently used evicted first), as `lab.audit.replay` does. Beside the pools,
the replay keeps what was ever seen: every block's chain hash with and without salts, on which
replica, and the text of every prompt in windows of `WINDOW` tokens. A request's uncached tokens,
from its first to its last, are then explained so:

    [cached | shareable blocks not served | last block | rest of the shared text | text never shared here]
             evicted, other_replica, salt   last_token   partial_block            other_prefix or cold

- The shared prefix is the longest one this request has with any earlier prompt (unsalted, on any
  replica). Its full blocks could have been hits: the first of them that was not one says why (this
  replica held it and evicted it; another replica holds it; only another salt's chain has it), and
  that cause takes the run of blocks from there to the end of the shared prefix, because a chain
  lookup stops at its first miss.
- A prompt whose every full block was seen still computes its last block: vLLM needs the last
  token's logits (`last_token`). Shared text that ends inside a block cannot be a hit at this block
  size (`partial_block`).
- After the shared prefix, text seen before in some earlier prompt, but behind a different prefix,
  is `other_prefix`: the chain broke at an earlier difference (a field, a reordered document);
  moving that difference to the end, or a position-independent cache, would reuse it. Everything
  else is `cold`.

No cause for requests in flight: vLLM V1 registers a block's hash when it schedules the block, not
when it has been computed, so a request that arrives while another is still computing the same
prefix shares it (notebook 14 shows twelve simultaneous requests getting the same cached tokens as
the sequential replay).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checks import positive_int
from lab.core.block_hash import (
    chain_hashes,
    full_blocks,
    hittable_blocks,
    kv_blocks,
    token_hit_rate,
)
from lab.core.prefix_cache import PrefixCache

CAUSES: dict[str, str] = {
    "evicted": "cached on this replica before and evicted since: a larger KV cache keeps it",
    "other_replica": "cached on another replica: route requests that share a prefix to the same one",
    "salt": "cached under another cache_salt: share the common part without a salt",
    "last_token": "the whole prompt was cached, but its last block is computed for the last token's logits",
    "partial_block": "shared text that ends inside a block, never a hit at this block size: a smaller block",
    "other_prefix": "text seen before, behind a different prefix: move what differs to the end",
    "cold": "text never seen before: no cache can serve it",
}
WINDOW = 16  # tokens in a row that count as text seen before (shorter matches are coincidence)
# windows kept every STRIDE tokens: a run seen before is found to within STRIDE tokens at each end
STRIDE = 8
_POWERS = np.array([pow(1_000_003, k, 1 << 64) for k in range(WINDOW - 1, -1, -1)], dtype=np.uint64)
_CONTINUATIONS_KEPT = (
    4  # distinct next blocks remembered per (chain, first token): enough to find the longest
)


@dataclass(frozen=True)
class Routes:
    """The replica (0 .. replicas - 1) that served each request, e.g. a router's or
    `lab.experiments.fleet_sim`'s routes, over a fleet of `replicas` (one may have served none)."""

    replica_of: Sequence[int]
    replicas: int

    def __post_init__(self) -> None:
        positive_int("replicas", self.replicas, "a positive number of replicas, e.g. 2")
        if any(not 0 <= r < self.replicas for r in self.replica_of):
            raise ValueError(
                f"replica_of must name replicas 0 .. {self.replicas - 1} (replicas={self.replicas})"
            )


@dataclass
class Misses:
    """The attribution of one trace: a row per request and the totals per cause."""

    block_size: int
    kv_tokens: int  # per replica
    replicas: int
    requests: (
        pd.DataFrame
    )  # request, replica, prompt_tokens, cached_tokens, one column per cause, shared_prefix,
    #                         blocks_stored
    evicted_hashes: set[bytes]  # chain hashes a later request missed because they were evicted
    evictions: int  # cached blocks the pools evicted (vLLM's BlockRemoved events)
    blocks_stored: int  # full blocks computed and cached (vLLM's BlockStored events)

    @property
    def totals(self) -> pd.Series:
        return self.requests[list(CAUSES)].sum()

    @property
    def hit_rate(self) -> float:
        return token_hit_rate(self.requests.cached_tokens, self.requests.prompt_tokens)

    def table(self) -> pd.DataFrame:
        """Tokens and share of prompt tokens per cause, with what each means; the cached tokens
        first."""
        total = self.requests.prompt_tokens.sum()
        rows = [("cached", int(self.requests.cached_tokens.sum()), "served from cache")]
        rows += [(cause, int(self.totals[cause]), meaning) for cause, meaning in CAUSES.items()]
        table = pd.DataFrame(rows, columns=["cause", "tokens", "meaning"])
        return table.assign(share=table.tokens / total)[["cause", "tokens", "share", "meaning"]]


class _Seen:
    """What the replay has seen so far, beyond what the pools hold now."""

    def __init__(self, replicas: int) -> None:
        self.unsalted: set[bytes] = set()  # chain hashes of every full block, as if no salt
        self.on_replica: list[set[bytes]] = [
            set() for _ in range(replicas)
        ]  # salted chain hashes each one stored
        self.continuations: dict[tuple[bytes | None, int], list[tuple[int, ...]]] = {}
        self.windows: set[int] = set()

    def shared_blocks(self, unsalted: Sequence[bytes]) -> int:
        n = 0
        while n < len(unsalted) and unsalted[n] in self.unsalted:
            n += 1
        return n

    def partial_match(self, parent: bytes | None, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` that continue some earlier prompt after the chain `parent`."""
        if not tokens:
            return 0
        best = 0
        for seen in self.continuations.get((parent, tokens[0]), ()):
            n = 0
            for a, b in zip(seen, tokens):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    def remember(
        self,
        token_ids: Sequence[int],
        block_size: int,
        unsalted: Sequence[bytes],
        salted: Sequence[bytes],
        replica: int,
        first_new: int,
    ) -> None:
        self.unsalted.update(unsalted)
        self.on_replica[replica].update(salted)
        starts = range(first_new * block_size, len(token_ids), block_size)
        for j, start in enumerate(
            starts, start=first_new
        ):  # every block from the first new one, the tail too
            kept = self.continuations.setdefault(
                (unsalted[j - 1] if j else None, token_ids[start]), []
            )
            block = tuple(token_ids[start : start + block_size])
            if len(kept) < _CONTINUATIONS_KEPT and block not in kept:
                kept.append(block)


def _window_hashes(token_ids: Sequence[int]) -> np.ndarray:
    """A rolling hash of every run of WINDOW tokens (entry q covers tokens q .. q + WINDOW - 1)."""
    if len(token_ids) < WINDOW:
        return np.zeros(0, dtype=np.uint64)
    tokens = np.asarray(token_ids, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return np.lib.stride_tricks.sliding_window_view(tokens, WINDOW) @ _POWERS


def _seen_text(windows: np.ndarray, seen: set[int], start: int, length: int) -> int:
    """Tokens from `start` (to `length`) that lie in a window of WINDOW tokens seen in an earlier
    prompt."""
    if length - start < WINDOW:
        return 0
    found = np.fromiter(
        map(seen.__contains__, windows[start:].tolist()), dtype=bool, count=len(windows) - start
    )
    covered = (
        np.convolve(found.astype(np.int8), np.ones(WINDOW, dtype=np.int8))[: length - start] > 0
    )
    return int(covered.sum())


def _first_miss_cause(block_hash: bytes, replica: int, seen: _Seen) -> str:
    if block_hash in seen.on_replica[replica]:
        return "evicted"
    if any(block_hash in hashes for hashes in seen.on_replica):
        return "other_replica"
    return "salt"  # seen without salts (it is shared text), never under this one


def _explain(
    token_ids: Sequence[int],
    cached: int,
    block_size: int,
    unsalted: list[bytes],
    salted: list[bytes],
    replica: int,
    seen: _Seen,
    windows: np.ndarray,
) -> tuple[dict[str, int], int]:
    """Tokens per cause for one request (they add up to its uncached tokens), and its shared prefix."""
    n, bs = len(token_ids), block_size
    causes = dict.fromkeys(CAUSES, 0)
    shared_blocks = seen.shared_blocks(unsalted)
    max_hit_blocks = hittable_blocks(n, bs)
    shareable_end = min(shared_blocks, max_hit_blocks) * bs
    if cached < shareable_end:
        causes[_first_miss_cause(salted[cached // bs], replica, seen)] = shareable_end - cached
    if shared_blocks > max_hit_blocks:
        causes["last_token"] = (shared_blocks - max_hit_blocks) * bs
    start = shared_blocks * bs
    partial = seen.partial_match(
        unsalted[shared_blocks - 1] if shared_blocks else None, token_ids[start : start + bs]
    )
    causes["partial_block"] = partial
    shared_prefix = start + partial
    causes["other_prefix"] = _seen_text(windows, seen.windows, shared_prefix, n)
    causes["cold"] = n - shared_prefix - causes["other_prefix"]
    return causes, shared_prefix


def attribute(
    token_ids: Sequence[Sequence[int]],
    *,
    block_size: int,
    kv_tokens: int,
    salts: Sequence[str | None] | None = None,
    routes: Routes | None = None,
    hash_algo: str = "sha256",
) -> Misses:
    """Replay the trace and give every uncached prompt token one cause (see the module docstring).
    `salts`: one cache_salt (or None) per request; `routes`: the replica that served each request,
    with `kv_tokens` each replica's (None: one engine). For a progress bar, pass `tqdm(token_ids)`.
    """
    positive_int("block_size", block_size, "a block size, e.g. 32")
    replicas, replica_of = (routes.replicas, routes.replica_of) if routes else (1, None)
    for name, values in (("salts", salts), ("routes", replica_of)):
        if values is not None and len(values) != len(token_ids):
            raise ValueError(
                f"{name} has {len(values)} entries for {len(token_ids)} prompts: give one per prompt"
            )
    pools = [
        PrefixCache(
            num_blocks=kv_blocks(kv_tokens, block_size), block_size=block_size, hash_algo=hash_algo
        )
        for _ in range(replicas)
    ]
    seen, rows, evicted = _Seen(replicas), [], set()
    for i, ids in enumerate(token_ids):
        salt, replica = salts[i] if salts else None, replica_of[i] if replica_of is not None else 0
        blocks = full_blocks(ids, block_size)
        unsalted = chain_hashes(blocks, hash_algo)
        salted = chain_hashes(blocks, hash_algo, salt) if salt else unsalted
        cached = pools[replica].allocate(f"r{i}", ids, cache_salt=salt)
        pools[replica].free(f"r{i}")
        windows = _window_hashes(ids)
        causes, shared_prefix = _explain(
            ids, cached, block_size, unsalted, salted, replica, seen, windows
        )
        if causes["evicted"]:
            evicted.add(salted[cached // block_size])
        rows.append(
            {"request": i, "replica": replica, "prompt_tokens": len(ids), "cached_tokens": cached}
            | causes
            | {"shared_prefix": shared_prefix}
        )
        first_new = seen.shared_blocks(unsalted)
        seen.remember(ids, block_size, unsalted, salted, replica, first_new)
        seen.windows.update(windows[first_new * block_size :: STRIDE].tolist())
    table = pd.DataFrame(rows)
    table["blocks_stored"] = (
        table.prompt_tokens // block_size - table.cached_tokens // block_size
    )  # full blocks computed
    return Misses(
        block_size,
        kv_tokens,
        replicas,
        table,
        evicted,
        sum(p.stats.evictions for p in pools),
        int(table.blocks_stored.sum()),
    )
