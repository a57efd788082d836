"""Every prompt generator of the lab, built from the lab's own sentences in data/corpus/ and
deterministic for a seed: the article-shaped workloads (each takes count and seed and returns
records {"id", "prompt", ...}; `GENERATORS` names them for lab.experiments.workloads), and the
token-id builders of the capacity curve, the benchmarks and the fleet simulator."""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache

from lab.checks import number_in, positive_int
from lab.core.model import tokenizer_for
from lab.core.random_model import corpus_lines

Record = dict


def num_tokens(text: str) -> int:
    """Length of `text` in tokens of the ruler the workloads are sized with (the lab's `tiny`
    tokenizer): a workload is text, "about N tokens" long; whoever serves it tokenizes it with their
    own model's tokenizer (`lab.core.model.tokenizer_for`)."""
    return len(tokenizer_for(None).encode(text))


@cache
def _sentences(kind: str) -> tuple[str, ...]:
    files = {
        "en": ["en.txt"],
        "zh": ["zh.txt"],
        "policy": ["templates.txt"],
        "all": ["en.txt", "zh.txt"],
    }[kind]
    return tuple(corpus_lines(*files))


@cache
def _sentence_tokens(kind: str) -> dict[str, int]:
    return {sentence: num_tokens(" " + sentence) - 1 for sentence in _sentences(kind)}  # minus <s>


def text_of_tokens(rng: random.Random, target_tokens: int, kind: str = "all") -> str:
    """Sentences drawn at random until the text is about `target_tokens` long (never shorter)."""
    sentences, tokens = _sentences(kind), _sentence_tokens(kind)
    parts: list[str] = []
    length = 0
    while length < target_tokens:
        sentence = rng.choice(sentences)
        parts.append(sentence)
        length += tokens[sentence]
    return " ".join(parts)


def user_message(rng: random.Random, target_tokens: int) -> str:
    order = f"My order number is {rng.randrange(10**6, 10**7)}."
    return order + " " + text_of_tokens(rng, max(1, target_tokens - 8), "all")


# --- the generators -------------------------------------------------------------------------------

ARTICLE_TEMPLATE_TOKENS = (96, 192, 320, 512, 768, 1024, 1536, 2048)


def article_1000(count: int = 1000, seed: int = 0) -> list[Record]:
    """The article's benchmark shape: shared system prompts of eight lengths (popular ones more
    often) followed by a user part of widely varying length."""
    rng = random.Random(seed)
    templates = [
        f"System prompt {i}. " + text_of_tokens(rng, n, "policy" if i % 2 else "all")
        for i, n in enumerate(ARTICLE_TEMPLATE_TOKENS)
    ]
    weights = [1 / (rank + 1) for rank in range(len(templates))]  # Zipf-like popularity
    order = list(range(len(templates)))
    rng.shuffle(order)
    records = []
    for i in range(count):
        t = rng.choices(order, weights)[0]
        user_tokens = int(min(600, rng.lognormvariate(4.0, 0.9)))
        records.append(
            {
                "id": f"article-{i}",
                "template": t,
                "prompt": templates[t]
                + "\nUser: "
                + user_message(rng, max(8, user_tokens))
                + "\nAssistant:",
            }
        )
    return records


def translation(count: int = 200, seed: int = 0) -> list[Record]:
    """The article's translation template: one fixed instruction (with a glossary), a varying
    sentence."""
    rng = random.Random(seed)
    instruction = (
        "You are a professional translator. Translate the English sentence into Chinese. "
        "Keep names and numbers unchanged. Glossary: " + text_of_tokens(rng, 280, "all")
    )
    english = _sentences("en")
    return [
        {
            "id": f"translation-{i}",
            "prompt": f"{instruction}\nSentence: {rng.choice(english)} "
            f"({rng.randrange(1000)})\nChinese:",
        }
        for i in range(count)
    ]


def customer_service(
    count: int = 300, seed: int = 0, template_seed: int | None = None
) -> list[Record]:
    """The article's three-stage bot, `count` requests per stage. The shares of fixed text are
    designed toward the article's hit rates (intent 98%, rewrite 65%, final 15%); the engine
    measures the real ones.

    - intent: a long fixed template (labels, rules, examples) and a short user message at the end;
    - rewrite: a fixed instruction, then the conversation so far (variable) and the new message;
    - final: a short fixed instruction, then retrieved passages and history that vary per request.

    `template_seed`: the fixed texts from this seed, the requests from `seed` (a long log written in
    batches keeps one bot's templates); by default both come from `seed`.
    """
    rng = random.Random(seed)
    fixed = rng if template_seed is None else random.Random(template_seed)
    intent_template = "Classify the customer's message.\n" + text_of_tokens(fixed, 1500, "policy")
    rewrite_instruction = "Rewrite the last message as a standalone question.\n" + text_of_tokens(
        fixed, 420, "policy"
    )
    final_instruction = (
        "Answer the customer using the passages.\n" + text_of_tokens(fixed, 110, "policy") + "\n"
    )
    records = []
    for i in range(count):
        message = user_message(rng, rng.randrange(12, 24))
        history = text_of_tokens(rng, rng.randrange(180, 260), "all")
        passages = text_of_tokens(rng, rng.randrange(320, 420), "all")
        records += [
            {
                "id": f"cs-intent-{i}",
                "stage": "intent",
                "prompt": f"{intent_template}\nMessage: {message}\nIntent:",
            },
            {
                "id": f"cs-rewrite-{i}",
                "stage": "rewrite",
                "prompt": f"{rewrite_instruction}\nConversation: {history}\nLast message: {message}\nQuestion:",
            },
            {
                "id": f"cs-final-{i}",
                "stage": "final",
                "prompt": f"{final_instruction}Passages: {passages}\nHistory: {history}\nCustomer: {message}\nAnswer:",
            },
        ]
    return records


def rag(
    count: int = 200,
    seed: int = 0,
    num_documents: int = 8,
    per_request: int = 3,
    document_tokens: int = 160,
) -> list[Record]:
    """Retrieval: each request gets `per_request` of `num_documents` shared documents (about
    `document_tokens` long) and a question. Two variants of the same requests: documents in
    retrieval (random) order, and sorted by id."""
    rng = random.Random(seed)
    documents = [
        f"[Document {d}] " + text_of_tokens(rng, document_tokens, "all")
        for d in range(num_documents)
    ]
    instruction = "Answer using only these documents and cite them.\n"
    records = []
    for i in range(count):
        chosen = rng.sample(range(num_documents), per_request)
        question = "Question: " + rng.choice(_sentences("all"))
        for variant, ids in (("retrieval_order", chosen), ("sorted_order", sorted(chosen))):
            records.append(
                {
                    "id": f"rag-{variant}-{i}",
                    "variant": variant,
                    "documents": ids,
                    "prompt": instruction + "\n".join(documents[d] for d in ids) + "\n" + question,
                }
            )
    return records


def chat(count: int = 40, seed: int = 0, turns: int = 5) -> list[Record]:
    """`count` conversations of `turns` turns; each turn's prompt is the whole history so far plus
    the new message, so turn t shares all of turn t-1's prompt. Records come turn by turn (turn 0 of
    every conversation first), as traffic from many users would."""
    rng = random.Random(seed)
    system = "You are a friendly assistant for a bookshop.\n"
    histories = [system for _ in range(count)]
    records = []
    for turn in range(turns):
        for c in range(count):
            histories[c] += f"User: {user_message(rng, rng.randrange(15, 40))}\n"
            records.append(
                {
                    "id": f"chat-{c}-{turn}",
                    "conversation": c,
                    "turn": turn,
                    "prompt": histories[c] + "Assistant:",
                }
            )
            histories[c] += f"Assistant: {text_of_tokens(rng, rng.randrange(30, 80), 'all')}\n"
    return records


def chat_messages(count: int = 40, seed: int = 0, turns: int = 5) -> list[Record]:
    """The chat workload as an OpenAI-style request log: each turn's `messages` hold the
    conversation so far (a system prompt, user and assistant turns) and the new user message, to be
    rendered by the model's chat template. Records come turn by turn, as in `chat`."""
    rng = random.Random(seed)
    histories = [
        [{"role": "system", "content": "You are a friendly assistant for a bookshop."}]
        for _ in range(count)
    ]
    records = []
    for turn in range(turns):
        for c in range(count):
            histories[c].append(
                {"role": "user", "content": user_message(rng, rng.randrange(15, 40))}
            )
            records.append(
                {
                    "id": f"chat-{c}-{turn}",
                    "conversation": c,
                    "turn": turn,
                    "messages": [dict(m) for m in histories[c]],
                }
            )
            histories[c].append(
                {"role": "assistant", "content": text_of_tokens(rng, rng.randrange(30, 80), "all")}
            )
    return records


def prompt_design(count: int = 100, seed: int = 0) -> list[Record]:
    """The article's before/after pair: one template, the same per-request variables (name, date,
    order), placed through the template ("scattered") or gathered at its end ("gathered"); and the
    layout of the article's own "optimised" template, each variable on a labelled line of its own at
    the start ("fields_first"). "categorical_first" is that layout with the article's own kind of
    fields up front: low-cardinality categories (customer type, question type), the per-request
    details kept with the question."""
    rng = random.Random(seed)
    categories = random.Random(
        seed + 1
    )  # a stream of its own: the other variants stay as they were
    sections = [text_of_tokens(rng, 150, "policy") for _ in range(4)]
    records = []
    for i in range(count):
        name, date = (
            rng.choice(["Ana", "Bo", "Chen", "Dara", "Eli", "Femi"]),
            f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        )
        order, question = rng.randrange(10**6, 10**7), rng.choice(_sentences("all"))
        scattered = (
            f"Customer {name} wrote on {date}.\n{sections[0]}\nOrder {order}.\n{sections[1]}\n"
            f"{sections[2]}\n{sections[3]}\nQuestion: {question}"
        )
        gathered = (
            f"{sections[0]}\n{sections[1]}\n{sections[2]}\n{sections[3]}\n"
            f"Customer {name} wrote on {date}. Order {order}.\nQuestion: {question}"
        )
        fields_first = (
            f"Customer: {name}\nDate: {date}\nOrder: {order}\n{sections[0]}\n{sections[1]}\n"
            f"{sections[2]}\n{sections[3]}\nQuestion: {question}"
        )
        customer_type = categories.choice(["guest", "member", "business"])
        question_type = categories.choice(["billing", "shipping", "returns", "account"])
        categorical_first = (
            f"Customer type: {customer_type}\nQuestion type: {question_type}\n{sections[0]}\n"
            f"{sections[1]}\n{sections[2]}\n{sections[3]}\n"
            f"Customer {name} wrote on {date}. Order {order}.\nQuestion: {question}"
        )
        records += [
            {"id": f"design-scattered-{i}", "variant": "scattered", "prompt": scattered},
            {"id": f"design-gathered-{i}", "variant": "gathered", "prompt": gathered},
            {"id": f"design-fields_first-{i}", "variant": "fields_first", "prompt": fields_first},
            {
                "id": f"design-categorical_first-{i}",
                "variant": "categorical_first",
                "prompt": categorical_first,
            },
        ]
    return records


def tenants(
    count: int = 256,
    seed: int = 0,
    num_tenants: int = 4,
    context_tokens: int = 2000,
    zipf: float = 0.0,
    shared_system_tokens: int = 0,
) -> list[Record]:
    """Many customers of one service: tenant k has a long private context (its documents) and asks
    short questions behind it. `zipf` = 0 makes every tenant equally popular; s > 0 asks tenant k
    with weight 1 / (k + 1)^s. `shared_system_tokens` > 0 puts one system prompt, the same for all,
    before every context. A replica that holds a tenant's context serves its questions from cache:
    routing decides the hit rate."""
    if num_tenants < 1 or context_tokens < 1 or zipf < 0 or shared_system_tokens < 0:
        raise ValueError(
            f"tenants(num_tenants={num_tenants}, context_tokens={context_tokens}, zipf={zipf}, "
            f"shared_system_tokens={shared_system_tokens}): use at least one tenant, a positive "
            "context, zipf >= 0 and shared_system_tokens >= 0"
        )
    rng = random.Random(seed)
    system = (
        text_of_tokens(rng, shared_system_tokens, "policy") + "\n" if shared_system_tokens else ""
    )
    contexts = [
        f"Documents of customer {k}:\n{text_of_tokens(rng, context_tokens, 'en')}"
        for k in range(num_tenants)
    ]
    weights = [1 / (k + 1) ** zipf for k in range(num_tenants)]
    records = []
    for i in range(count):
        k = rng.choices(range(num_tenants), weights)[0]
        question = text_of_tokens(rng, 12, "en")
        records.append(
            {
                "id": f"tenant-{k}-{i}",
                "tenant": k,
                "prompt": f"{system}{contexts[k]}\nQuestion: {question}",
            }
        )
    return records


GENERATORS: dict[str, Callable[..., list[Record]]] = {
    "article_1000": article_1000,
    "translation": translation,
    "customer_service": customer_service,
    "rag": rag,
    "chat": chat,
    "prompt_design": prompt_design,
    "tenants": tenants,
}


# --- token ids for the capacity curve, the benchmarks and the fleet simulator
# -----------------------


def shared_fraction_prompts(
    tokenizer, count: int, fraction: float, prompt_tokens: int, seed: int = 0
) -> list[list[int]]:
    """`count` prompts of exactly `prompt_tokens` token ids: the first `fraction` of them one shared
    text, the rest unique to each prompt (it starts with the prompt's own number, so no later block
    is shared)."""
    number_in(
        "fraction",
        fraction,
        0,
        1,
        "a number in [0, 1) (a share of each prompt's tokens)",
        ends="[)",
    )
    positive_int("count", count)
    positive_int("prompt_tokens", prompt_tokens, "an integer of at least 2", minimum=2)
    rng = random.Random(seed)
    lines = corpus_lines()
    n_shared = round(fraction * prompt_tokens)

    def text_ids(prefix: str, n: int) -> list[int]:
        ids = tokenizer.encode(prefix, add_special_tokens=False)
        while len(ids) < n:
            ids += tokenizer.encode(" " + rng.choice(lines), add_special_tokens=False)
        return ids[:n]

    shared = ([tokenizer.bos_token_id] + text_ids("Shared instructions:", n_shared - 1))[:n_shared]
    prompts = []
    for i in range(count):
        start = [tokenizer.bos_token_id] if not shared else []
        prompts.append(
            shared
            + start
            + text_ids(f"Request {i} of {count}:", prompt_tokens - n_shared - len(start))
        )
    return prompts


def shared_prefix_workload(
    tokenizer, n_requests: int, prefix_tokens: int, n_prefixes: int = 4, seed: int = 0
) -> list[list[int]]:
    """`n_requests` prompts: one of `n_prefixes` long system prompts, then a short user question."""
    rng = random.Random(seed)
    lines = corpus_lines()
    prefixes = []
    for _ in range(n_prefixes):
        ids = [tokenizer.bos_token_id]
        while len(ids) < prefix_tokens:
            ids += tokenizer.encode(" " + rng.choice(lines), add_special_tokens=False)
        prefixes.append(ids[:prefix_tokens])
    return [
        rng.choice(prefixes)
        + tokenizer.encode(" Question: " + rng.choice(lines), add_special_tokens=False)
        for _ in range(n_requests)
    ]


def synthetic_tenants(
    num_tenants: int,
    num_requests: int,
    context_tokens: int,
    *,
    zipf: float = 0.0,
    shared_system_tokens: int = 0,
    seed: int = 0,
) -> tuple[list[list[int]], list[int]]:
    """Token ids of a multi-tenant workload too large to tokenize: each request is its tenant's
    private context and a short question of its own, optionally behind one system prompt shared by
    every tenant. Tenant k is asked with weight 1 / (k + 1) ** zipf. Returns the requests and each
    request's tenant. (Only which tokens repeat matters to a prefix cache, so random ids stand in
    for text.)"""
    if (
        num_tenants < 1
        or num_requests < 1
        or context_tokens < 1
        or zipf < 0
        or shared_system_tokens < 0
    ):
        raise ValueError(
            f"synthetic_tenants(num_tenants={num_tenants}, num_requests={num_requests}, "
            f"context_tokens={context_tokens}, zipf={zipf}, shared_system_tokens={shared_system_tokens}): "
            "use at least one tenant, request and context token, zipf >= 0, shared_system_tokens >= 0"
        )
    import torch  # its generator keeps the ids of every recorded run

    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, 30000, (shared_system_tokens,), generator=g).tolist()
    contexts = [
        system + torch.randint(3, 30000, (context_tokens,), generator=g).tolist()
        for _ in range(num_tenants)
    ]
    weights = torch.tensor([1 / (k + 1) ** zipf for k in range(num_tenants)])
    order = torch.multinomial(weights, num_requests, replacement=True, generator=g).tolist()
    return [contexts[t] + [1, 2, i % 30000 + 3] for i, t in enumerate(order)], order
