"""lab.audit.partitioned: the fleet's replay cut into one stream per replica, run as tasks on a local Dask cluster
of two worker processes, equals the same replay in one process, and each stream equals the PrefixCache replay."""

import os

import numpy as np
import pytest

from lab.audit.partitioned import fleet_replay, tenant_routes
from lab.audit.prompts import load_tokenizer, read_prompts
from lab.audit.trace import read_trace
from lab.core.block_hash import REPLAY_HASH
from lab.core.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def log(tmp_path_factory, write_jsonl):
    lines = [{"prompt": f"Tenant {i % 5} rules: " + f"rule {i % 5} applies. " * 60 + f"Question {i}?",
              "tenant": f"t{i % 5}"} for i in range(90)]
    return write_jsonl(tmp_path_factory.mktemp("fleet") / "log.jsonl", lines)


def test_a_tenant_always_lands_on_one_replica():
    routes = tenant_routes(["a", "b", "a", None, "c", "a"], replicas=3)
    assert routes[0] == routes[2] == routes[5] and set(routes.tolist()) <= {0, 1, 2}


def test_each_replicas_stream_is_the_prefix_cache_replay_of_its_requests(log):
    tok = load_tokenizer(None)
    trace, prompts = read_trace(log, tok, block_sizes=[32], progress=False), read_prompts(log, tok, progress=False)
    cached, routes = fleet_replay(trace, replicas=3, block_size=32, kv_tokens=2_000), tenant_routes(trace.tenants, 3)
    for replica in range(3):
        mine = [ids for ids, r in zip(prompts.token_ids, routes) if r == replica]
        pool = PrefixCache(num_blocks=2_000 // 32, block_size=32, hash_algo=REPLAY_HASH)
        assert cached[routes == replica].tolist() == pool.replay(mine)


@pytest.mark.slow
def test_the_replay_on_a_local_dask_cluster_equals_the_one_in_process(log):
    from dask import distributed  # requirements-dev.txt installs it (not the runtime: the audit runs without it)

    trace = read_trace(log, load_tokenizer(None), block_sizes=[32], progress=False)
    alone = fleet_replay(trace, replicas=4, block_size=32, kv_tokens=2_000)
    environ = dict(os.environ)  # dask's nanny sets PYTHONHASHSEED in this process, which vLLM's first-block hash reads
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            spread = fleet_replay(trace, replicas=4, block_size=32, kv_tokens=2_000, client=client)
            assert len(client.scheduler_info()["workers"]) == 2
    finally:
        os.environ.clear()
        os.environ.update(environ)
    assert np.array_equal(spread, alone) and alone.sum() > 0
