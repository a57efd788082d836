"""The requests a prefix-breaker reads and rewrites: each as the log sent it (a plain prompt, or
chat messages and tools) with its text as the server renders it; a rewritten request rendered again
through the same chat template and tokenized the way the audit tokenized the log."""

from __future__ import annotations

import dataclasses
import graphlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab.audit.piece_tokens import TokenEncoder
from lab.audit.prompts import Prompts


@dataclass(frozen=True)
class Request:
    """One request: `text` as the server renders it (None once rewritten, until rendered again);
    `messages` and `tools` for a chat (None for a plain prompt, whose text is the prompt)."""

    text: str | None
    messages: tuple[dict, ...] | None = None
    tools: tuple[dict, ...] | None = None

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def contents(self) -> list[str]:
        """The text a fix may rewrite: the prompt, or each message's content that is a string."""
        if not self.chat:
            return [self.text]
        return [m["content"] for m in self.messages if isinstance(m.get("content"), str)]

    def rewritten(self, rewrite: Callable[[str], str]) -> Request:
        """This request with `rewrite` applied to the prompt, or to each message's content (itself
        if unchanged)."""
        if not self.chat:
            text = rewrite(self.text)
            return self if text == self.text else Request(text)
        messages = tuple(
            m | {"content": rewrite(m["content"])} if isinstance(m.get("content"), str) else m
            for m in self.messages
        )
        return self if messages == self.messages else self.with_chat(messages, self.tools)

    def with_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> Request:
        """A chat request with these messages and tools, to be rendered again."""
        return Request(None, tuple(messages), None if tools is None else tuple(tools))


def requests_of(sample: Prompts, count: int) -> list[Request]:
    """The first `count` requests of the audit's sample, as the log sent them."""
    chats = sample.chats or [None] * len(sample.texts)
    return [
        Request(text)
        if chat is None
        else Request(
            text, tuple(chat["messages"]), None if chat["tools"] is None else tuple(chat["tools"])
        )
        for text, chat in zip(sample.texts[:count], chats[:count])
    ]


class Renderer:
    """Requests into text and token ids as the audit read the log: a chat through the model's
    template (tools included, the generation prompt added) and tokenized without special tokens; a
    prompt with them."""

    def __init__(self, tokenizer, encoder: TokenEncoder) -> None:
        self.tokenizer, self.encoder = tokenizer, encoder

    def text(self, request: Request, add_generation_prompt: bool = True) -> str:
        if not request.chat:
            return request.text
        tools = None if request.tools is None else list(request.tools)
        return self.tokenizer.apply_chat_template(
            list(request.messages),
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def rendered(self, requests: Sequence[Request]) -> list[Request]:
        """Each request with its text (rendered again where a fix rewrote it)."""
        return [
            r if r.text is not None else dataclasses.replace(r, text=self.text(r)) for r in requests
        ]

    def ids(self, requests: Sequence[Request]) -> list[list[int]]:
        """The token ids of rendered requests, the chats' and the prompts' each in one batch."""
        chats = iter(
            self.encoder.ids([r.text for r in requests if r.chat], add_special_tokens=False)
        )
        plain = iter(self.encoder.ids([r.text for r in requests if not r.chat]))
        return [next(chats) if r.chat else next(plain) for r in requests]


@dataclass
class Detection:
    """What a detector found in the requests: `found`, a sentence with its counts; `what`, the thing
    to change, as the advice names it; `plan`, what the fix needs (each detector's own)."""

    found: str
    what: str = ""
    plan: object = None


def changed(before: Sequence[Request], after: Sequence[Request]) -> list[int]:
    """The positions a fix rewrote (a fix returns an unchanged request itself)."""
    return [i for i, (a, b) in enumerate(zip(before, after)) if a is not b]


def orders_disagree(orders: Sequence[Sequence[object]]) -> bool:
    """Whether no one order of the items is kept by every sequence in `orders` (each of distinct
    items): the precedence the sequences give, pair by adjacent pair, holds a cycle."""
    graph: dict[object, set[object]] = {}
    for order in orders:
        for a, b in zip(order, order[1:]):
            graph.setdefault(b, set()).add(a)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError:
        return True
    return False
