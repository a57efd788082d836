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


# (notebook, exercise, the wrong idea, its code)
WRONG = [
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
