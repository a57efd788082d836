"""Every build-it exercise makes a wrong idea fail: the common wrong answer, submitted in place of the solution,
fails at least one of the exercise's own checks (with its hint), and the solution passes them all. The checks run
as the handed-out notebook runs them: after the exercises' own set-up cells, nothing from the lesson above."""

import json

import pytest

from lab import PROJECT_ROOT

NOTEBOOKS = PROJECT_ROOT / "notebooks"


def _raw(cell: dict) -> str:
    return "".join(cell["source"])


def exercise(notebook: str, name: str) -> tuple[list[str], str, list[tuple[str, str]]]:
    """The set-up code of a notebook's exercises (its code cells outside every question, in order), the named
    question's solution, and its checks as (failure message, code)."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    start = next(i for i, c in enumerate(cells) if _raw(c).startswith("## Exercises"))
    setup, solution, checks, current, part = [], "", [], None, None
    for cell in cells[start:]:
        text = _raw(cell)
        if cell["cell_type"] == "raw":
            if text.startswith("# BEGIN QUESTION"):
                current = text.split("name:")[1].split()[0]
            elif text.startswith("# END QUESTION"):
                current = None
            elif text.startswith(("# BEGIN SOLUTION", "# BEGIN TESTS")):
                part = text.split()[-1]
            elif text.startswith(("# END SOLUTION", "# END TESTS")):
                part = None
            continue
        if cell["cell_type"] != "code":
            continue
        if current is None:
            setup.append(text)
        elif current == name and part == "SOLUTION":
            solution += text + "\n"
        elif current == name and part == "TESTS":
            message = text.split("failure_message:", 1)[1].split("\n", 1)[0].strip().strip('"')
            checks.append((message, text))
    if not checks:
        raise KeyError(f"{notebook} has no exercise {name!r}")
    return setup, solution, checks


def failures(notebook: str, name: str, answer: str) -> list[str]:
    """The failure messages of the exercise's checks that `answer` (code) fails."""
    setup, _, checks = exercise(notebook, name)
    namespace: dict = {}
    for code in setup:
        exec(code, namespace)
    exec(answer, namespace)
    failed = []
    for message, code in checks:
        try:
            exec(code, namespace)
        except Exception:  # an AssertionError, or an answer of the wrong shape
            failed.append(message)
    return failed


# (notebook, exercise, the wrong idea, its code): every exercise's common wrong idea, and each build-it's
WRONG = [
    ("00_quickstart", "predict_cached_tokens", "every shared token is cached, partial block too", "predicted = 100"),
    ("01_block_hashing", "changed_blocks", "only the block holding the changed token", "changed = [2]"),
    ("01_block_hashing", "last_token_rule", "four cached blocks, all four taken", "from_cache = 128"),
    ("02_mini_engine", "suffix_computed", "the whole document from cache, its partial block too",
     "tokens_computed = 23"),
    ("02_mini_engine", "same_prompt_again", "nothing computed a second time", "tokens_computed_again = 0"),
    ("02_mini_engine", "same_prompt_again", "the last token alone, not its block", "tokens_computed_again = 1"),
    ("03_ttft_breakdown", "ttft_parts", "the prefill as the whole time to first token",
     "queued_ms, prefill_ms = 350, 520"),
    ("04_block_size_sweep", "block_size_95", "the largest size, bookkeeping before hits", "largest_size = 256"),
    ("05_cache_on_vs_off", "speedup_bound", "the hit rate added to one", "bound = 1 + 0.85"),
    ("06_prompt_design", "reorder_template", "what differs first, the shared text after it",
     'better = "Customer: {name}\\nQuestion: {question}\\n" + instructions'),
    ("07_cache_warmup", "warmed_tokens", "the whole warm-up prompt, its partial block too", "cached = 100"),
    ("08_eviction", "smallest_pool", "the pool that holds the longest prompt", "smallest_blocks = 56"),
    ("08_eviction", "a_little_short", "a pool short of the working set thrashes: nothing hits",
     'cached_per_request, evicted_first = 0, "head"'),
    ("08_eviction", "a_little_short", "the hits shrink in proportion to the pool",
     'cached_per_request, evicted_first = int(16 * block * 58 / 65), "tail"'),
    ("09_serving_and_metrics", "hit_rate_from_metrics", "hits over hits and queries together",
     "hit_rate = 30720 / (30720 + 48000)"),
    ("10_timing_side_channel", "salt_per_tenant", "the caller's own salt, when it gives one", '''
def salt_for(tenant, requested_salt):
    return requested_salt or f"tenant:{tenant}"'''),
    ("11_routing", "misses_with_a_key", "one cold request per tenant and replica under the key",
     "cold_requests, cold_round_robin = 8, 8"),
    ("11_routing", "misses_with_a_key", "round robin as kind to the cache as the key",
     "cold_requests, cold_round_robin = 4, 4"),
    ("12_fleet_simulator", "best_policy", "round robin, the evenest load", 'best_policy = "round_robin"'),
    ("12_fleet_simulator", "round_robin_before_the_run", "the fleet holds every context, so nearly all hit",
     "predicted_hit_rate = 0.95"),
    ("13_replica_failure", "cost_of_a_dead_cache", "every request computes its context again",
     "computed_tokens = 4 * (640 + 8)"),
    ("14_why_it_missed", "short_system_prompt", "the whole system prompt from cache",
     "cached, partial = 90, 0"),
    ("15_cost_model", "gain_below_bound", "the bound itself", "gain = 5.0"),
    ("16_gain_vs_hit_rate", "implied_hit_rate", "the throughput ratio read as the hit rate", "h_min = 12.5 / 22.8"),
    ("17_capacity", "capacity_ratio", "the highest rate each side was swept at, 16 over 4", "capacity_ratio = 4"),
    ("17_capacity", "capacity_beyond_the_bound", "capacity can never pass the bound",
     'vs_bound, capacity_ratio_at_target = "below", 4.0'),
    ("17_capacity", "capacity_beyond_the_bound", "the right number, the prediction not checked against it",
     'vs_bound, capacity_ratio_at_target = "at", 380 / 80'),
    ("18_model_size", "gain_with_other_work", "the bound, as if prefill were all the work",
     'vs_bound, expected_gain = "below", 4.0'),
    ("18_model_size", "gain_with_other_work", "work the cache does not remove raises the gain",
     'vs_bound, expected_gain = "above", 1 / (0.1 + 0.9 * 0.25)'),
    ("19_checking_the_article", "fixed_concurrency_throughput", "the time falls, the throughput stays",
     "two_facts, throughput_on = True, 40 / 2.0"),
    ("19_checking_the_article", "fixed_concurrency_throughput", "the right throughput, two facts all the same",
     "two_facts, throughput_on = True, 40 / 1.6"),
    ("20_your_workload", "find_the_field", "the question, which also differs, but at the end",
     'breaking_label, predicted_hit_rate = "Q:", 0.9'),
    ("20_your_workload", "find_the_field", "the right line, but moving it saves little",
     'breaking_label, predicted_hit_rate = "Session:", 0.3'),
    ("21_real_traffic", "third_request_cached", "both full blocks, the new id's too", "cached_third = 1024"),
    ("01_block_hashing", "build_the_hash_chain", "each block hashed on its own, no parent", '''
def build_block_hashes(token_ids, block_size, cache_salt=None):
    return [sha256((None, tuple(token_ids[s:s + block_size]), None))
            for s in range(0, len(token_ids) - block_size + 1, block_size)]'''),
    ("01_block_hashing", "build_the_hash_chain", "the partial last block hashed too", '''
def build_block_hashes(token_ids, block_size, cache_salt=None):
    parent, hashes = none_hash(), []
    for s in range(0, len(token_ids), block_size):
        parent = sha256((parent, tuple(token_ids[s:s + block_size]), (("cache_salt", cache_salt),) if cache_salt and s == 0 else None))
        hashes.append(parent)
    return hashes'''),
    ("01_block_hashing", "build_the_hash_chain", "the salt in every block's extra keys", '''
def build_block_hashes(token_ids, block_size, cache_salt=None):
    parent, hashes = none_hash(), []
    for s in range(0, len(token_ids) - block_size + 1, block_size):
        parent = sha256((parent, tuple(token_ids[s:s + block_size]), (("cache_salt", cache_salt),) if cache_salt else None))
        hashes.append(parent)
    return hashes'''),
    ("08_eviction", "build_the_release", "the blocks appended in their order, head first", '''
def release(queue, table):
    return list(queue) + [block for block, _ in table]'''),
    ("08_eviction", "build_the_release", "every block to the tail, unhashed ones too", '''
def release(queue, table):
    return list(queue) + [block for block, _ in reversed(table)]'''),
    ("11_routing", "build_the_router_choice", "the longest prefix alone: a miss always to node 0", '''
def choose(matches, computed):
    return matches.index(max(matches))'''),
    ("11_routing", "build_the_router_choice", "the least-loaded node alone, the cache ignored", '''
def choose(matches, computed):
    return computed.index(min(computed))'''),
    ("22_passage_reuse", "choose_the_tokens", "the tokens that moved most anywhere, not only among the reused", '''
def choose(deviation, reused, ratio):
    mask = torch.zeros_like(reused)
    mask[deviation.argsort(descending=True)[:round(ratio * int(reused.sum()))]] = True
    return mask'''),
    ("22_passage_reuse", "choose_the_tokens", "the ratio taken of every position, not of the reused ones", '''
def choose(deviation, reused, ratio):
    mask = torch.zeros_like(reused)
    mask[torch.where(reused, deviation, torch.tensor(-1.0)).argsort(descending=True)[:round(ratio * len(reused))]] = True
    return mask & reused'''),
    ("23_kv_tier", "build_the_crossover", "the transfer time left out: loading always wins", '''
def crossover(latency_s, bandwidth, flops_per_s, kv_bytes, flops_per_token):
    return latency_s / (flops_per_token / flops_per_s)'''),
    ("23_kv_tier", "build_the_crossover", "a negative crossover below break-even instead of never", '''
def crossover(latency_s, bandwidth, flops_per_s, kv_bytes, flops_per_token):
    saved = flops_per_token / flops_per_s - kv_bytes / bandwidth
    return latency_s / saved if saved else math.inf'''),
]


@pytest.mark.parametrize(("notebook", "name", "idea", "answer"), WRONG, ids=[f"{n}-{i}" for _, n, i, _ in WRONG])
def test_the_common_wrong_answer_fails_with_a_hint(notebook, name, idea, answer):
    assert failures(notebook, name, answer), f"{notebook}'s {name} accepts a wrong idea: {idea}"


@pytest.mark.parametrize(("notebook", "name"), sorted({(n, e) for n, e, _, _ in WRONG}))
def test_the_solution_passes_every_check(notebook, name):
    _, solution, _ = exercise(notebook, name)
    assert failures(notebook, name, solution) == []


def test_every_exercise_has_a_wrong_idea_that_fails_it():
    """No exercise goes untested: each names its common wrong idea above."""
    questions = {(path.stem, raw.split("name:")[1].split()[0])
                 for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
                 for cell in json.loads(path.read_text())["cells"]
                 if cell["cell_type"] == "raw" and (raw := _raw(cell)).startswith("# BEGIN QUESTION")}
    assert questions - {(notebook, name) for notebook, name, _, _ in WRONG} == set()
