"""The audit on a local Ray cluster of two CPUs equals the single-process audit exactly: a sharded prompts log
(reading actors, a replay task per block size) and a sharded block-hash trace (a task per capacity and routing
policy). Bad lines are still named by shard and line, and bad settings by name."""

import gzip
import json

import pytest

from lab import PROJECT_ROOT
from lab.audit import audit
from lab.audit.__main__ import main, parser, settings_from
from lab.audit.prompts import AuditInputError
from lab.audit.settings import AuditSettings, SettingsError

ray = pytest.importorskip("ray")
from test_shards import cut, records  # noqa: E402 (after the skip: these tests need Ray)

CONVERSATION = PROJECT_ROOT / "data" / "traces" / "mooncake_conversation_trace.jsonl.gz"
VARIES = ("seconds", "reading_workers")  # how long it took and on how many workers: the rest must be equal


def same(a: dict, b: dict) -> bool:
    """Equal reports, but for the time taken and the workers (NaN equal to NaN)."""
    def text(report):
        return json.dumps({k: v for k, v in report.items() if k not in VARIES}, default=str, sort_keys=True)
    return text(a) == text(b)


def report(folder) -> dict:
    (written,) = folder.glob("*.json")
    return json.loads(written.read_text())


def trace_shards(folder, requests: int = 2000):
    """The first requests of Kimi's hour dealt over two gzipped shards."""
    lines = gzip.open(CONVERSATION, "rt").read().splitlines()[:requests]
    folder.mkdir()
    for k in range(2):
        with gzip.open(folder / f"part-{k}.jsonl.gz", "wt") as f:
            f.write("\n".join(lines[k::2]) + "\n")
    return folder


def test_the_command_starts_a_local_cluster_and_writes_the_single_process_report(tmp_path, capsys):
    shards = trace_shards(tmp_path / "trace")
    flags = ["--replicas", "4", "--kv-tokens", "200000"]
    assert main([str(shards), *flags, "--out", str(tmp_path / "alone")]) == 0
    assert main([str(shards), *flags, "--ray", "--workers", "2", "--out", str(tmp_path / "ray")]) == 0
    alone, on_ray = report(tmp_path / "alone"), report(tmp_path / "ray")
    assert same(on_ray, alone) and on_ray["requests"] == 2000
    assert not ray.is_initialized()  # the cluster it started is stopped


@pytest.fixture(scope="module")
def two_cpus():
    """One local cluster for the tests below (the audit joins a Ray already connected in its process)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_a_sharded_prompts_log_on_ray_equals_one_process(tmp_path, write_jsonl, two_cpus):
    shards = cut(records(60), tmp_path / "shards", write_jsonl)
    settings = AuditSettings(replicas=2, kv_tokens=40_000, block_sizes=(16, 32, 64), progress=False)
    alone = audit(shards, settings)
    on_ray = audit(shards, AuditSettings.build(settings, ray="local"))
    assert same(on_ray.to_json(), alone.to_json()) and on_ray.prompts == 60
    assert on_ray.reading_workers == 2 and ray.is_initialized()  # a cluster it joined is left running


def test_a_bad_line_read_on_ray_is_named_by_its_shard_and_line(tmp_path, write_jsonl, two_cpus):
    folder = cut(records(9), tmp_path / "shards", write_jsonl)
    with gzip.open(folder / "b.jsonl.gz", "at") as f:
        f.write("not json\n")
    with pytest.raises(AuditInputError, match=r"b\.jsonl\.gz:4: not JSON"):
        audit(folder, replicas=2, kv_tokens=40_000, progress=False, ray="local")


def test_ray_settings_from_the_command_line():
    assert settings_from(parser().parse_args(["log.jsonl", "--ray"])).ray == "local"
    assert settings_from(parser().parse_args(["log.jsonl", "--ray", "auto"])).ray == "auto"
    assert settings_from(parser().parse_args(["log.jsonl"])).workers == 1
    with pytest.raises(SettingsError, match="ray=''"):
        AuditSettings(ray="")


def test_the_ray_benchmark_runs_small_and_finds_the_reports_equal(two_cpus):
    from lab.audit import ray_bench
    from lab.experiments.results import load_latest

    assert ray_bench.run(300, [2]) == 0  # 0: the report on Ray equals the one in one process
    table, meta = load_latest("bench_ray-300")
    assert table.setup.tolist() == ["one process, no Ray", "Ray, 2 worker(s)"] and meta["environment"]["reports_equal"]
    assert meta["environment"]["driver_read_s"] > 0 and (table.seconds > 0).all()
