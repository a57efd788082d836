"""vLLM's Prometheus `/metrics`: parsed with prometheus-client's parser, and scraped in the
background while requests run."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence

# vLLM's metric names, as /metrics spells them (counters end in _total in the text format) and, for
# the last two, as the in-process engine's get_metrics() does
PREFIX_CACHE_QUERIES = (
    "vllm:prefix_cache_queries_total"  # prompt tokens looked up in the prefix cache
)
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # prompt tokens found there
REQUEST_SUCCESS = "vllm:request_success_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # fraction of KV blocks in use (gauge, 0-1)
NUM_PREEMPTIONS = "vllm:num_preemptions"


def metrics_text(url: str) -> str:
    """GET `url` (a server's /metrics): Prometheus text."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets, from Prometheus text (prometheus-client's
    parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


@contextlib.contextmanager
def scraping(server, names: Sequence[str], interval_s: float = 0.1) -> Iterator[list[dict]]:
    """Scrape `server`'s `/metrics` (anything with a `.metrics()`) every `interval_s` from a
    background thread while the block runs. Yields the list it fills: one row per scrape, `seconds`
    since the start and the value of each of `names`. The first row is taken before the block
    starts, the last after it ends."""
    if not interval_s > 0:
        raise ValueError(
            f"interval_s={interval_s!r}: use a positive number of seconds between scrapes"
        )
    rows: list[dict] = []
    stop = threading.Event()
    start = time.perf_counter()

    def scrape() -> None:
        values = server.metrics()
        rows.append(
            {"seconds": time.perf_counter() - start}
            | {n: values.get(n, float("nan")) for n in names}
        )

    def loop() -> None:
        while not stop.wait(interval_s):
            scrape()

    scrape()
    thread = threading.Thread(target=loop, name="metrics-scraper", daemon=True)
    thread.start()
    try:
        yield rows
    finally:
        stop.set()
        thread.join()
        scrape()
