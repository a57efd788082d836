import json

import pytest

from lab.experiments.generators import GENERATORS, num_tokens
from lab.experiments.workloads import generate_workload, load_workload


@pytest.fixture
def workloads_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_WORKLOADS_DIR", str(tmp_path))
    return tmp_path


SMALL = {"article_1000": 60, "translation": 10, "customer_service": 10, "rag": 10, "chat": 6, "prompt_design": 6, "tenants": 12}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_same_seed_same_prompts_other_seed_other_prompts(name):
    a, b = generate_workload(name, SMALL[name], seed=0), generate_workload(name, SMALL[name], seed=0)
    assert a.records == b.records
    assert a.prompts != generate_workload(name, SMALL[name], seed=1).prompts


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_saved_file_and_manifest_agree(name, workloads_dir):
    workload = load_workload(name, SMALL[name])
    stem = workloads_dir / f"{name}-n{SMALL[name]}-seed0"
    records = [json.loads(line) for line in stem.with_suffix(".jsonl").read_text().splitlines()]
    manifest = json.loads(stem.with_suffix(".manifest.json").read_text())
    assert records == workload.records and manifest["records"] == len(records)
    lengths = [num_tokens(r["prompt"]) for r in records]
    assert lengths == [r["prompt_tokens"] for r in records]
    assert manifest["prompt_tokens"]["min"] == min(lengths) and manifest["prompt_tokens"]["max"] == max(lengths)
    assert load_workload(name, SMALL[name]).records == records, "a second load reads the file"


def test_article_workload_shares_a_few_templates_over_a_wide_length_spread():
    workload = generate_workload("article_1000", 200)
    templates = {r["template"] for r in workload.records}
    assert 4 <= len(templates) <= 8
    stats = workload.manifest["prompt_tokens"]
    assert stats["max"] > 8 * stats["min"], "the article's prompts vary widely in length"
    by_template = {}
    for r in workload.records:
        by_template.setdefault(r["template"], []).append(r["prompt"].split("\nUser: ")[0])
    assert all(len(set(prefixes)) == 1 for prefixes in by_template.values())


def test_prompt_design_layouts_carry_the_same_variables_in_different_places():
    records = generate_workload("prompt_design", 8).records
    by_variant = {v: [r["prompt"] for r in records if r["variant"] == v] for v in ("scattered", "gathered", "fields_first")}
    assert all(len(prompts) == 8 for prompts in by_variant.values())
    for scattered, gathered, fields_first in zip(*by_variant.values()):
        question = gathered.rsplit("\nQuestion: ", 1)[1]
        assert scattered.endswith(question) and fields_first.endswith(question)
        assert fields_first.startswith("Customer: ") and scattered.startswith("Customer ")
    shared_start = {p[:200] for p in by_variant["gathered"]}
    assert len(shared_start) == 1, "gathered: every prompt opens with the same fixed text"
    categorical = [r["prompt"] for r in records if r["variant"] == "categorical_first"]
    assert len({p.split("\n", 2)[2][:200] for p in categorical}) == 1, "the fixed text follows the two category lines"
    assert len({p[:60] for p in categorical}) <= 12, "at most 3 customer types x 4 question types open a prompt"
    assert [p.rsplit("\nQuestion: ", 1)[1] for p in categorical] == [p.rsplit("\nQuestion: ", 1)[1] for p in by_variant["gathered"]]


def test_tenants_share_a_private_context_each_and_skew_with_zipf():
    records = generate_workload("tenants", 64).records
    contexts = {}
    for r in records:
        contexts.setdefault(r["tenant"], set()).add(r["prompt"].split("\nQuestion: ")[0])
    assert sorted(contexts) == [0, 1, 2, 3] and all(len(c) == 1 for c in contexts.values())
    assert len({next(iter(c))[:300] for c in contexts.values()}) == 4, "contexts differ from their first tokens"
    assert all(num_tokens(next(iter(c))) >= 2000 for c in contexts.values())
    from lab.experiments.generators import tenants
    skewed = [r["tenant"] for r in tenants(400, num_tenants=8, context_tokens=50, zipf=1.5)]
    assert skewed.count(0) > 4 * skewed.count(7), "Zipf: the first tenant is asked far more often"
    shared = tenants(4, num_tenants=2, context_tokens=50, shared_system_tokens=200)
    assert len({r["prompt"][:400] for r in shared}) == 1, "one system prompt before every context"
    with pytest.raises(ValueError, match="num_tenants=0"):
        tenants(4, num_tenants=0)


def test_customer_service_stages_share_less_and_less():
    workload = generate_workload("customer_service", 5)
    prompts = {stage: [r["prompt"] for r in workload.records if r["stage"] == stage]
               for stage in ("intent", "rewrite", "final")}

    def shared_share(texts):
        common = 0
        while all(len(t) > common and t[common] == texts[0][common] for t in texts):
            common += 1
        return common / len(texts[0])

    assert shared_share(prompts["intent"]) > 0.9 > shared_share(prompts["rewrite"]) > 0.4 > shared_share(prompts["final"])


def test_chat_turns_extend_the_previous_turn():
    records = generate_workload("chat", 3).records
    turns = {(r["conversation"], r["turn"]): r["prompt"] for r in records}
    assert turns[(1, 2)].startswith(turns[(1, 1)].removesuffix("Assistant:"))


def test_bad_names_and_counts_are_named():
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*article_1000"):
        load_workload("nope")
    with pytest.raises(ValueError, match="count=0"):
        generate_workload("chat", 0)


def test_a_saved_file_is_read_back_while_its_fingerprint_matches(workloads_dir, write_jsonl):
    load_workload("chat", 2)
    jsonl = workloads_dir / "chat-n2-seed0.jsonl"
    write_jsonl(jsonl, [json.loads(line) | {"marked": True} for line in jsonl.read_text().splitlines()])
    assert all(r.get("marked") for r in load_workload("chat", 2).records), "the file, not a regeneration"


def test_a_file_from_other_generators_corpus_or_tokenizer_is_regenerated(workloads_dir):
    fresh = load_workload("chat", 2)
    manifest_path = workloads_dir / "chat-n2-seed0.manifest.json"
    jsonl = workloads_dir / "chat-n2-seed0.jsonl"
    stale = json.loads(manifest_path.read_text()) | {"fingerprint": "made by an older lab"}
    manifest_path.write_text(json.dumps(stale))
    jsonl.write_text(json.dumps({"id": "old", "prompt": "stale"}) + "\n")
    reloaded = load_workload("chat", 2)
    assert reloaded.records == fresh.records and reloaded.manifest["fingerprint"] == fresh.manifest["fingerprint"]
    assert json.loads(manifest_path.read_text())["fingerprint"] == fresh.manifest["fingerprint"], "the file is replaced"


def test_the_fingerprint_follows_the_corpus(monkeypatch, tmp_path):
    import shutil

    import lab.experiments.workloads

    before = lab.experiments.workloads.fingerprint()
    corpus = tmp_path / "corpus"
    shutil.copytree(lab.experiments.workloads.CORPUS_DIR, corpus)
    monkeypatch.setattr(lab.experiments.workloads, "CORPUS_DIR", corpus)
    assert lab.experiments.workloads.fingerprint() == before, "same corpus, same fingerprint"
    with (corpus / "en.txt").open("a") as f:
        f.write("One more sentence.\n")
    assert lab.experiments.workloads.fingerprint() != before


def test_a_chat_log_holds_each_conversation_so_far():
    """chat_messages: every turn's messages are the previous turn's, its answer and a new user message."""
    from lab.experiments.generators import chat_messages

    records = chat_messages(count=3, seed=0, turns=3)
    assert len(records) == 9 and [r["turn"] for r in records] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for earlier, later in zip(records, records[3:]):
        assert later["conversation"] == earlier["conversation"]
        assert later["messages"][:len(earlier["messages"])] == earlier["messages"]
        assert [m["role"] for m in later["messages"][len(earlier["messages"]):]] == ["assistant", "user"]
    assert all(r["messages"][0]["role"] == "system" and r["messages"][-1]["role"] == "user" for r in records)
