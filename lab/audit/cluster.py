"""The audit's independent work on a Ray cluster (`prefix-cache-audit LOGS --ray [ADDRESS]`), with
the same numbers as one process.

    with cluster.connected("local", workers=2):      # or an address: "auto", "ray://head:10001"
        chunks = cluster.ordered_reads(reader, batches, keep_before)
        rates = cluster.map_in_order(replay, block_sizes, shared=(trace,))

Ray is the runtime vLLM itself uses for multi-node serving, so a serving team that runs vLLM across
machines already runs it. Two kinds of work go out:
- **Reading**: one actor per CPU holds a copy of the reader (its tokenizer and its own piece memo)
  and parses, tokenizes and hashes the chunks handed to it. The driver reads the raw lines and
  numbers them, as one process does, so every record keeps its number across shards; results come
  back in the order the chunks were sent.
- **Replays** (a block size, a capacity): one task each, the trace put in the object store once.

Outside `connected()`, `map_in_order` runs here, one item after another, and nothing imports Ray.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

LOCAL = "local"  # `--ray` with no address: start a cluster on this machine, and stop it after
IN_FLIGHT_PER_ACTOR = 2  # chunks queued at each reading actor: one reading, one waiting

_connected = False


class ClusterError(RuntimeError):
    """Ray is missing or its cluster cannot be reached; the message says what would work."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "--ray needs Ray: pip install 'prefix-cache-lab[cluster]' (or ray==2.60.0, the "
            "version tested)"
        ) from None
    return ray


@contextmanager
def connected(address: str, workers: int) -> Iterator[int]:
    """Ray running for the block; yields the CPUs it offers. `address` LOCAL starts a cluster of
    `workers` CPUs on this machine and stops it after; any other address joins that cluster (its
    CPUs, not `workers`, set the width) and leaves it running. Where this process is already
    connected (the caller ran `ray.init`), that cluster is used and left as it is."""
    global _connected
    ray = _ray()
    joined = ray.is_initialized()
    if not joined:
        _start(ray, address, workers)
    _connected = True
    try:
        yield int(ray.cluster_resources().get("CPU", 1))
    finally:
        _connected = False
        if not joined:
            ray.shutdown()  # a cluster at an address runs on: this only disconnects


def _start(ray, address: str, workers: int) -> None:
    os.environ.setdefault(
        "RAY_AUTH_MODE", "disabled"
    )  # a local cluster for one command: no token to hand out
    local = address == LOCAL
    try:
        ray.init(
            address=None if local else address,
            num_cpus=workers if local else None,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise ClusterError(
            f"--ray {address}: cannot reach a Ray cluster there ({error}); start one with "
            "`ray start --head`, then pass its address (or `auto` on one of its machines), or give "
            "--ray alone for a cluster on this machine"
        ) from None


def active() -> bool:
    """Whether the audit's work goes to Ray (inside `connected()`)."""
    return _connected


def _result(ray, ref):
    """A task's value; a task's error is raised as itself (an AuditInputError stays one, its message
    unchanged)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        raise error.cause from None


class _Reading:
    """A reading actor's state: its own copy of the reader, and so its own piece memo."""

    def __init__(self, reader) -> None:
        os.environ["TOKENIZERS_PARALLELISM"] = (
            "false"  # one thread each: the actors are the parallelism
        )
        self.reader = reader

    def read(self, records: list, keep_before):
        return self.reader.read(records, keep_before)


def ordered_reads(reader, batches: Iterable[list], keep_before: Callable[[], object]) -> Iterator:
    """`reader.read(batch, keep_before())` for every batch, on one actor per CPU of the cluster,
    yielded in the order of `batches`, a few batches in flight per actor."""
    ray = _ray()
    actor = ray.remote(num_cpus=1)(_Reading)
    width = max(1, int(ray.cluster_resources().get("CPU", 1)))
    shared = ray.put(reader)
    actors = [actor.remote(shared) for _ in range(width)]
    batches = iter(batches)
    pending: deque = deque()
    for sent, batch in enumerate(batches):
        pending.append(actors[sent % width].read.remote(batch, keep_before()))
        if len(pending) >= IN_FLIGHT_PER_ACTOR * width:
            yield _result(ray, pending.popleft())
    while pending:
        yield _result(ray, pending.popleft())


def map_in_order(
    function: Callable,
    items: Iterable,
    *,
    shared: tuple = (),
    desc: str = "",
    progress: bool = False,
) -> list:
    """`function(*shared, item)` for every item, in order: each a Ray task inside `connected()`
    (`shared` put in the object store once), else here, one after another. `function` must be
    importable (a module's own)."""
    from tqdm.auto import tqdm

    items = list(items)
    bar = tqdm(total=len(items), desc=desc, disable=not progress, leave=False)
    if not _connected:
        values = []
        for item in items:
            values.append(function(*shared, item))
            bar.update()
        bar.close()
        return values
    ray = _ray()
    task = ray.remote(num_cpus=1)(function)
    shared_refs = [ray.put(value) for value in shared]
    refs = [task.remote(*shared_refs, item) for item in items]
    values = []
    for ref in refs:
        values.append(_result(ray, ref))
        bar.update()
    bar.close()
    return values
