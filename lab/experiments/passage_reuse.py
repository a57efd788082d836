"""Passage reuse measured: RAG prompts built from the lab's corpus, each retrieved passage holding
one fact, and the five fills of `lab.core.passage_cache` compared on them for time and for quality
against the full prefill.

Quality is measured three ways, each against the full prefill of the same prompt:
- the next-token distributions along the full prefill's own greedy answer (teacher-forced): their
  mean KL divergence and the share of positions whose top token agrees;
- how many greedy tokens stay equal to the full prefill's;
- the question set: is the fact's code the first number the method's greedy answer gives (exact
  match)?
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm import tqdm

from lab.checks import positive_int
from lab.core.passage_cache import Fill, Method, PassageEngine
from lab.core.random_model import corpus_lines

FACT_NAMES = (
    "harbour",
    "orchard",
    "lantern",
    "quarry",
    "meadow",
    "citadel",
    "glacier",
    "bazaar",
    "canyon",
    "delta",
    "ferry",
    "granary",
    "hangar",
    "island",
    "jetty",
    "kiln",
    "lagoon",
    "mill",
    "observatory",
    "pier",
    "reef",
    "summit",
    "tannery",
    "valley",
    "wharf",
    "vineyard",
    "foundry",
    "lighthouse",
    "marsh",
    "plateau",
)
SYSTEM_TEXT = "Answer the question from the passages. Give the code only."


@dataclass(frozen=True)
class Passage:
    token_ids: list[int]
    name: str  # whose code the passage states
    code: str  # four digits


@dataclass(frozen=True)
class RagPrompt:
    chunks: list[list[int]]  # the head (system text), the passages in retrieved order, the question
    code: str  # the answer


def chat_pieces(tokenizer) -> tuple[str, str]:
    """The text before and after a user message in the model's chat template (plain labels where it
    has none)."""
    marker = "\x00USER\x00"
    if not getattr(tokenizer, "chat_template", None):
        return f"System: {SYSTEM_TEXT}\nUser: ", "\nAssistant:"
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": marker}],
        add_generation_prompt=True,
        tokenize=False,
    )
    head, tail = text.split(marker)
    return head, tail


def make_passages(tokenizer, count: int, passage_tokens: int, seed: int = 0) -> list[Passage]:
    """`count` passages of about `passage_tokens` tokens of corpus sentences, each with one sentence
    stating a code at a random place in it."""
    positive_int("count", count)
    positive_int("passage_tokens", passage_tokens, "at least 16 tokens", minimum=16)
    if count > len(FACT_NAMES):
        raise ValueError(
            f"count={count}: at most {len(FACT_NAMES)} passages, one per name in FACT_NAMES"
        )
    rng, lines = random.Random(seed), corpus_lines("en.txt")
    passages = []
    for name in FACT_NAMES[:count]:
        code = f"{rng.randrange(1000, 10000)}"
        sentences = []
        while len(tokenizer.encode(" ".join(sentences), add_special_tokens=False)) < passage_tokens:
            sentences.append(rng.choice(lines))
        sentences.insert(rng.randrange(len(sentences) + 1), f"The code of the {name} is {code}.")
        ids = tokenizer.encode("Passage: " + " ".join(sentences) + "\n\n", add_special_tokens=False)
        passages.append(Passage(ids, name, code))
    return passages


def rag_prompts(
    tokenizer, passages: list[Passage], count: int, per_prompt: int, seed: int = 0
) -> list[RagPrompt]:
    """`count` prompts, each `per_prompt` passages in a random order and a question about one of
    them."""
    positive_int("per_prompt", per_prompt)
    if per_prompt > len(passages):
        raise ValueError(
            f"per_prompt={per_prompt} is more than the {len(passages)} passages there are"
        )
    rng = random.Random(seed)
    head, tail = chat_pieces(tokenizer)
    head_ids = tokenizer.encode(head, add_special_tokens=False)
    prompts = []
    for _ in range(count):
        chosen = rng.sample(passages, per_prompt)
        asked = rng.choice(chosen)
        question = tokenizer.encode(
            f"Question: what is the code of the {asked.name}?{tail}", add_special_tokens=False
        )
        prompts.append(RagPrompt([head_ids, *[p.token_ids for p in chosen], question], asked.code))
    return prompts


def answer_code(text: str) -> str | None:
    found = re.search(r"\d+", text)
    return found.group() if found else None


def with_answer(
    engine: PassageEngine, prompt: RagPrompt, method: Method, answer: list[int]
) -> tuple[Fill, torch.Tensor]:
    """One fill of the prompt with `answer` after its question (teacher forcing): the prompt's own
    fill (its rows, which no later row changes under causal attention) and the next-token logits at
    each position of `answer`."""
    asked, n = len(prompt.chunks[-1]), sum(map(len, prompt.chunks))
    whole = engine.fill([*prompt.chunks[:-1], prompt.chunks[-1] + answer], method)
    own = Fill(
        method,
        whole.logits[:asked],
        [k[:n] for k in whole.keys],
        [v[:n] for v in whole.values],
        whole.recomputed[:, :n],
        whole.seconds,
    )
    return own, whole.logits[asked - 1 : -1]


def agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """Mean KL(reference || other) in nats, and the share of positions whose top token agrees."""
    ref, oth = reference.log_softmax(-1), other.log_softmax(-1)
    kl = (ref.exp() * (ref - oth)).sum(-1).mean().item()
    return kl, (reference.argmax(-1) == other.argmax(-1)).float().mean().item()


def equal_lead(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy outputs share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def quality_rows(
    engine: PassageEngine,
    prompts: list[RagPrompt],
    methods: list[Method],
    answer_tokens: int,
    tokenizer,
    greedy: list[Method] | None = None,
) -> pd.DataFrame:
    """One row per prompt and method: its compute share, KL and top-1 agreement along the full
    prefill's answer, greedy tokens equal to the full prefill's, and whether its answer gives the
    code, for the methods in `greedy` (default: all; each answer decoded costs as much as
    `answer_tokens` reads of every weight). (Timing: `timing_rows`.)"""
    rows = []
    for i, prompt in enumerate(tqdm(prompts, desc="quality, prompt by prompt")):
        reference = engine.decode(engine.fill(prompt.chunks, Method("full")), answer_tokens)
        _, reference_logits = with_answer(engine, prompt, Method("full"), reference)
        for method in methods:
            filled, logits = with_answer(engine, prompt, method, reference)
            kl, top1 = agreement(reference_logits, logits)
            row = {
                "prompt": i,
                "method": str(method),
                "compute_share": filled.compute_share,
                "kl_nats": kl,
                "top1_agreement": top1,
                "greedy_equal_tokens": None,
                "exact_match": None,
            }
            if greedy is None or method in greedy:
                output = (
                    reference if method.name == "full" else engine.decode(filled, answer_tokens)
                )
                row |= {
                    "greedy_equal_tokens": equal_lead(output, reference),
                    "exact_match": answer_code(tokenizer.decode(output)) == prompt.code,
                }
            rows.append(row)
    return pd.DataFrame(rows)


def timing_rows(
    engine: PassageEngine, prompt: RagPrompt, methods: list[Method], repeats: int, seed: int = 0
) -> pd.DataFrame:
    """Fill seconds of each method on one prompt, `repeats` rounds, the methods in a new random
    order each round (so a slow spell of the machine falls on all of them); every chunk is stored
    before the first round."""
    positive_int("repeats", repeats)
    rng = random.Random(seed)
    for method in methods:
        engine.fill(prompt.chunks, method)  # stores the chunks and warms every path
    rows = []
    for round_ in tqdm(range(repeats), desc="timing, round by round"):
        for method in rng.sample(methods, len(methods)):
            fill: Fill = engine.fill(prompt.chunks, method)
            rows.append(
                {
                    "round": round_,
                    "method": str(method),
                    "fill_s": fill.seconds,
                    "compute_share": fill.compute_share,
                }
            )
    return pd.DataFrame(rows)


def speedups(timing: pd.DataFrame) -> pd.DataFrame:
    """Per method, the full fill's seconds over its own in each round (paired): median, lowest and
    highest."""
    wide = timing.pivot(index="round", columns="method", values="fill_s")
    full = wide["full"]
    rows = [
        {
            "method": m,
            "compute_share": timing[timing.method == m].compute_share.iloc[0],
            "speedup_median": (full / wide[m]).median(),
            "speedup_low": (full / wide[m]).min(),
            "speedup_high": (full / wide[m]).max(),
        }
        for m in wide.columns
    ]
    return pd.DataFrame(rows).sort_values("compute_share", ascending=False, ignore_index=True)
