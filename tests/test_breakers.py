"""lab.audit.breakers: each prefix-breaker in a generated log that has it, found, and the gain the audit states
checked against a replay of the same log rewritten by hand; a clean log gets no advice; a fix that does not gain
is never recommended."""

import html
import json
import random

import pytest

from lab.audit import audit
from lab.audit.breakers import FixReplay, breakers_in
from lab.audit.prompts import load_tokenizer, read_prompts
from lab.audit.replay import replay_hit_rate
from lab.audit.report import breaker_lines, terminal_summary, write_report
from lab.core.model import ensure_model
from lab.experiments.generators import chat_messages, rag, text_of_tokens

BLOCK, KV = 32, 100_000
START = 1_764_579_600  # 2026-12-01T09:00:00Z
TOOLS_TEMPLATE = ("{% if tools %}<|tools|>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
                  "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
LATEST_REASONING_TEMPLATE = (  # shows only the latest assistant turn's reasoning, as some reasoning models' do
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' and loop.index0 != ns.last and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1].lstrip() }}{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def model_with_template(tmp_path_factory):
    """`model_with_template(template)`: the lab's tiny model with another chat template (a local model directory)."""
    def make(template: str):
        folder = tmp_path_factory.mktemp("model")
        source = ensure_model("tiny")
        for name in ("config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                     "tokenizer.json"):
            (folder / name).symlink_to(source / name)
        config = json.loads((source / "tokenizer_config.json").read_text()) | {"chat_template": template}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        return str(folder)
    return make


def found_in(path, tokenizer):
    return breakers_in(read_prompts(path, tokenizer, progress=False), tokenizer, FixReplay(BLOCK, KV))


def replayed(path, tokenizer) -> float:
    """The hit rate of a log read as the audit reads it and replayed at the tests' block size and capacity."""
    return replay_hit_rate(read_prompts(path, tokenizer, progress=False).token_ids, BLOCK, KV)


def check_gain(found, name, log, by_hand, tokenizer):
    """`name` is recommended first, with the hit rates a replay of the log and of its hand-rewritten copy give."""
    best = found.recommendations[0]
    assert best.breaker == name and best.requests > 0 and best.gain_points >= 1
    assert best.hit_rate_before == pytest.approx(replayed(log, tokenizer), abs=1e-9)
    assert abs(best.hit_rate_after - replayed(by_hand, tokenizer)) <= 0.01, "the stated gain is a replay"
    return best


# --- the logs ------------------------------------------------------------------------------------------------

def rag_chat(count=160, seed=0, documents=12, stable=False):
    """The issue's RAG log: one system text, three of `documents` handbook passages per question in score order (or
    by id), two tenants, the lines out of time order."""
    rng = random.Random(seed)
    passages = [text_of_tokens(rng, 120, "all") for _ in range(documents)]
    system = "You answer from the handbook.\n" + text_of_tokens(rng, 150, "policy")
    records = []
    for i in range(count):
        chosen = rng.sample(range(documents), 3)
        context = "\n".join(f"[doc {d}] {passages[d]}" for d in (sorted(chosen) if stable else chosen))
        question = text_of_tokens(rng, 15, "en")
        records.append({"messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": f"Context:\n{context}\nQuestion: {question}"}],
                        "tenant": f"tenant-{i % 2}", "timestamp": START + i})
    return [records[i] for i in sorted(range(count), key=lambda i: (i % 7, i))]  # out of time order in the file


def thinking(records):
    """Each assistant message with a reasoning block in front of its reply."""
    for r in records:
        for m in r["messages"]:
            if m["role"] == "assistant" and not m["content"].startswith("<think>"):
                m["content"] = f"<think>The customer asks about {m['content'][:50]}</think>\n{m['content']}"
    return records


def stripped(content):
    return content.split("</think>")[-1].lstrip()


# --- each breaker -------------------------------------------------------------------------------------------

def test_passages_in_score_order_are_put_in_a_stable_order(tmp_path, tok, write_jsonl):
    """The generator's two variants: retrieval order, and the same requests sorted by id (the rewrite by hand)."""
    records = rag(150, num_documents=8)
    log = write_jsonl(tmp_path / "rag.jsonl", [{"prompt": r["prompt"]} for r in records if r["variant"] == "retrieval_order"])
    by_hand = write_jsonl(tmp_path / "sorted.jsonl", [{"prompt": r["prompt"]} for r in records if r["variant"] == "sorted_order"])
    best = check_gain(found_in(log, tok), "passage_order", log, by_hand, tok)
    assert best.advice.startswith("put the passages in a stable order") and best.changes_what_the_model_sees
    assert "[Document" in best.example.before[0] and best.example.after_token > best.example.before_token
    assert found_in(by_hand, tok).recommendations == [], "passages already in one order: nothing to change"


def test_the_issues_rag_chat_log_gets_the_stable_order_with_its_replayed_gain(tmp_path, tok, write_jsonl):
    """Chat requests, passages as `[doc N]` lines in the user message, two tenants, timestamps out of file order:
    the audit's verdict names the fix, with the gain a replay of the sorted log gives."""
    log = write_jsonl(tmp_path / "rag_chat.jsonl", rag_chat())
    by_hand = write_jsonl(tmp_path / "rag_chat_sorted.jsonl", rag_chat(stable=True))
    result = audit(log, block_sizes=[BLOCK], kv_tokens=KV, replicas=2, progress=False)
    best = check_gain(result.breakers, "passage_order", log, by_hand, tok)
    assert best.hit_rate_before == pytest.approx(result.hit_rate_by_block_size[BLOCK]), "the same replay as the audit's"
    assert best.gain_points > 5
    summary = terminal_summary(result)
    assert summary.splitlines()[2].startswith("Worth changing: put the passages in a stable order")
    assert f"{best.hit_rate_before:.1%} -> {best.hit_rate_after:.1%}" in summary and "e.g. lines" in summary
    page, saved = write_report(result, tmp_path)
    assert "Prefix-breakers, ranked by measured gain" in page.read_text()
    assert html.escape("put the passages in a stable order") in page.read_text()
    assert json.loads(saved.read_text())["breakers"]["recommendations"][0]["breaker"] == "passage_order"


def tools_log(count=90, seed=0, stable=False):
    """Tool definitions in a shuffled order (and a third of them written with their keys in another order)."""
    rng = random.Random(seed)
    names = ["search_handbook", "lookup_order", "refund", "escalate", "book_courier", "check_stock"]
    tools = [{"type": "function", "function": {"name": n, "description": text_of_tokens(rng, 40, "en"),
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
             for n in names]
    system = "You are the shop's assistant.\n" + text_of_tokens(rng, 150, "policy")
    records = []
    for i in range(count):
        sent = sorted(tools, key=lambda t: t["function"]["name"]) if stable else rng.sample(tools, len(tools))
        if not stable and i % 3 == 0:  # another code path writes the keys in another order
            sent = [{"function": t["function"], "type": t["type"]} for t in sent]
        records.append({"messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": text_of_tokens(rng, 20, "en")}], "tools": sent})
    return records


def test_tools_in_varying_order_are_sorted(tmp_path, model_with_template, write_jsonl):
    model = model_with_template(TOOLS_TEMPLATE)
    tok = load_tokenizer(model)
    log, by_hand = write_jsonl(tmp_path / "tools.jsonl", tools_log()), write_jsonl(tmp_path / "sorted.jsonl", tools_log(stable=True))
    found = found_in(log, tok)
    best = check_gain(found, "tool_order", log, by_hand, tok)
    assert "orders that contradict" in best.found and "keys in different orders" in best.found


def test_a_fix_the_template_does_not_render_is_never_recommended(tmp_path, tok, write_jsonl):
    """The lab's template ignores tools: sorting them changes no token, so there is nothing to recommend."""
    found = found_in(write_jsonl(tmp_path / "tools.jsonl", tools_log()), tok)
    assert found.recommendations == []
    assert [(n.breaker, n.reason) for n in found.not_worth] == [("tool_order", "the chat template renders none of the change")]


def stamped_chat(count=60, seed=0, moved=False):
    rng = random.Random(seed)
    shared = "You are the support assistant.\n" + text_of_tokens(rng, 300, "policy")
    records = []
    for i in range(count):
        stamp, question = f"Current time: 2026-11-30 09:{i // 60:02d}:{i % 60:02d}", text_of_tokens(rng, 15, "en")
        system, user = (shared, f"{question}\n{stamp}") if moved else (f"{stamp}\n{shared}", question)
        records.append({"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    return records


def test_a_timestamp_in_the_system_message_moves_to_the_last_message(tmp_path, tok, write_jsonl):
    log = write_jsonl(tmp_path / "stamped.jsonl", stamped_chat())
    best = check_gain(found_in(log, tok), "leading_field", log,
                      write_jsonl(tmp_path / "moved.jsonl", stamped_chat(moved=True)), tok)
    assert "'Current time:' (timestamp" in best.advice and best.hit_rate_before < 0.1 < 0.8 < best.hit_rate_after


def reasoning_chats(keep="all", count=16, turns=5):
    """Chats whose assistant turns hold reasoning: `keep` all of it, only the latest turn's (the client strips the
    rest), or none."""
    records = thinking(chat_messages(count, seed=3, turns=turns))
    for r in records:
        assistant = [m for m in r["messages"] if m["role"] == "assistant"]
        for m in assistant[:-1] if keep == "latest" else assistant if keep == "none" else []:
            m["content"] = stripped(m["content"])
    return [{"messages": r["messages"]} for r in records]


def test_history_rewritten_by_the_client_is_kept_as_sent(tmp_path, tok, write_jsonl):
    """The client strips earlier turns' reasoning, keeping only the latest: each turn stops sharing at the turn it
    rewrote. Kept as sent, every turn extends the one before."""
    log = write_jsonl(tmp_path / "rewritten.jsonl", reasoning_chats(keep="latest"))
    best = check_gain(found_in(log, tok), "history_rewritten", log,
                      write_jsonl(tmp_path / "kept.jsonl", reasoning_chats(keep="all")), tok)
    assert "reasoning" in best.caveat


def test_history_cut_at_the_front_is_kept_whole(tmp_path, tok, write_jsonl):
    """The client sends the system message and the last four messages only."""
    whole = [{"messages": r["messages"]} for r in chat_messages(16, seed=4, turns=6)]
    cut = [{"messages": r["messages"][:1] + r["messages"][1:][-4:]} for r in whole]
    log = write_jsonl(tmp_path / "cut.jsonl", cut)
    best = check_gain(found_in(log, tok), "history_truncated", log, write_jsonl(tmp_path / "whole.jsonl", whole), tok)
    assert best.found.endswith("cut off the front")


def test_a_template_that_rewrites_history_is_met_by_stripping_reasoning(tmp_path, model_with_template, write_jsonl):
    """The template shows only the latest turn's reasoning: the messages extend each other, the prompts do not."""
    tok = load_tokenizer(model_with_template(LATEST_REASONING_TEMPLATE))
    log = write_jsonl(tmp_path / "reasoning.jsonl", reasoning_chats(keep="all"))
    found = found_in(log, tok)
    check_gain(found, "template_rewrites_history", log, write_jsonl(tmp_path / "none.jsonl", reasoning_chats(keep="none")), tok)
    assert "history_rewritten" not in {r.breaker for r in found.recommendations}, "the client sent the history unchanged"


def test_whitespace_written_differently_is_normalised(tmp_path, tok, write_jsonl):
    """A template engine that leaves a trailing space on some lines, differently per request."""
    rng = random.Random(5)
    lines = ["You are the support assistant."] + [text_of_tokens(rng, 40, "policy") for _ in range(8)]
    questions = [text_of_tokens(rng, 15, "en") for _ in range(80)]
    sloppy = ["\n".join(line + " " * (rng.random() < 0.3) for line in lines) + f"\nQuestion: {q}" for q in questions]
    clean = ["\n".join(lines) + f"\nQuestion: {q}" for q in questions]
    log = write_jsonl(tmp_path / "sloppy.jsonl", [{"prompt": p} for p in sloppy])
    best = check_gain(found_in(log, tok), "whitespace", log,
                      write_jsonl(tmp_path / "clean.jsonl", [{"prompt": p} for p in clean]), tok)
    assert not best.changes_what_the_model_sees


# --- no false advice, and the ranking -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["shared_system", "chat", "rag_sorted"])
def test_a_clean_log_gets_no_advice(tmp_path, tok, name, write_jsonl):
    rng = random.Random(0)
    shared = text_of_tokens(rng, 400, "policy")
    records = {"shared_system": [{"prompt": f"{shared}\nQuestion {i}: {text_of_tokens(rng, 30, 'all')}"} for i in range(40)],
               "chat": [{"messages": r["messages"]} for r in chat_messages(20, turns=4)],
               "rag_sorted": rag_chat(80, stable=True)}[name]
    result = audit(write_jsonl(tmp_path / f"{name}.jsonl", records), block_sizes=[BLOCK], replicas=2, progress=False)
    assert result.breakers.recommendations == []
    assert "prefix-breakers: no fix found" in terminal_summary(result)


def test_several_breakers_are_ranked_each_on_top_of_the_ones_above(tmp_path, tok, write_jsonl):
    """A timestamp in front hides what ordering the passages behind it gains; both are found and ranked, and the
    last one's hit rate is a replay of the log with both fixed by hand."""
    def log(fixed: bool):
        records = []
        for i, r in enumerate(x for x in rag(120, num_documents=8) if x["variant"] == ("sorted_order" if fixed else "retrieval_order")):
            stamp = f"Request time: 2026-11-30 10:{i // 60:02d}:{i % 60:02d}"
            records.append({"prompt": f"{r['prompt']}\n{stamp}" if fixed else f"{stamp}\n{r['prompt']}"})
        return records
    path = write_jsonl(tmp_path / "both.jsonl", log(False))
    found = found_in(path, tok)
    assert [r.breaker for r in found.recommendations] == ["leading_field", "passage_order"]
    first, second = found.recommendations
    assert second.hit_rate_before == first.hit_rate_after and second.gain_points >= 1
    assert abs(second.hit_rate_after - replayed(write_jsonl(tmp_path / "fixed.jsonl", log(True)), tok)) <= 0.01


# --- beyond prefixes ----------------------------------------------------------------------------------------

def test_chunks_are_the_passages_and_the_text_around_them():
    from lab.audit.breakers.anywhere import chunks

    text = "Context:\n[doc 3] the third\n[doc 1] the first\nQuestion: why?"
    assert chunks(text) == [(False, "Context:"), (True, " the third"), (True, " the first"), (False, "Question: why?")]
    assert chunks("no passage here") == [(False, "no passage here")]


def test_passages_in_new_subsets_need_blending_and_one_set_in_new_orders_does_not(tmp_path, tok, write_jsonl):
    """Three of twelve passages per question: sorting them leaves most passages behind ones they never followed,
    so reuse anywhere reaches far more than a prefix. The same three in every order: sorting captures it all."""
    from lab.audit.breakers.anywhere import MARGIN_POINTS

    subsets = found_in(write_jsonl(tmp_path / "subsets.jsonl", rag_chat(count=80)), tok).anywhere
    assert subsets is not None and subsets.gap_points > 10 and not subsets.reordering_captures_it
    assert "only blending reaches" in subsets.sentence() and "in the lab's benchmark `bench_blend_quality-" in \
        subsets.sentence(), "the cost of blending, from the canonical benchmark"
    one_set = found_in(write_jsonl(tmp_path / "one_set.jsonl", rag_chat(count=80, documents=3)), tok)
    assert one_set.recommendations[0].breaker == "passage_order"
    assert 0 <= one_set.anywhere.gap_points < MARGIN_POINTS and one_set.anywhere.reordering_captures_it
    assert "reordering, whose reuse is a prefix cache's and so exact, already captures it" in one_set.anywhere.sentence()
    assert "beyond prefixes: reusing a passage" in "\n".join(breaker_lines(one_set))


def test_a_log_without_passages_has_no_estimate_beyond_prefixes(tmp_path, tok, write_jsonl):
    log = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": f"Question {i}: " + "same words " * 40} for i in range(20)])
    assert found_in(log, tok).anywhere is None
