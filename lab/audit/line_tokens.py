"""Tokenizing a log a line at a time: each distinct line once, however many prompts repeat it.

A log repeats itself: the same system prompt, template or retrieved passage in thousands of requests, and every
turn of a chat sends the turns before it again. Tokenizing whole prompts costs the same for all of it; here each
line is tokenized the first time it is seen and its ids are reused after, so the cost follows the new text.

It is exact only where a line break is always a token boundary. For byte-level BPE with GPT-2's split pattern
(SmolLM2's tokenizer, and the lab's own) and no normalizer, a "\\n" between two characters that are not
whitespace always stands alone: no split-pattern match runs across it, so the prompt's ids are its lines' ids
with the "\\n"'s ids between them. `LineTokenizer.for_tokenizer` returns None for any other tokenizer (a
normalizer, another split pattern, an added token that strips whitespace or holds a line break), and the
caller tokenizes whole prompts. The tests compare both ways on generated text for both local tokenizers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

MEMO_CHARS = 64_000_000  # characters of distinct lines remembered (their ids: about 128 MB) before starting again


def split_lines(text: str) -> list[str]:
    """`text` cut at every line break that has a character other than whitespace on both sides."""
    lines = text.split("\n")
    if len(lines) == 1:
        return lines
    out = [lines[0]]
    for line in lines[1:]:
        if out[-1] and line and not out[-1][-1].isspace() and not line[0].isspace():
            out.append(line)
        else:
            out[-1] += "\n" + line
    return out


class LineTokenizer:
    """`encode(texts)`: the ids the Rust tokenizer gives each whole text, computed a distinct line at a time."""

    def __init__(self, backend, prefix: list[int], suffix: list[int]) -> None:
        self.backend, self.prefix, self.suffix = backend, prefix, suffix
        self.newline = np.asarray(backend.encode("\n", add_special_tokens=False).ids, dtype=np.int64)
        self.memo: dict[str, np.ndarray] = {}
        self.remembered = 0

    @classmethod
    def for_tokenizer(cls, tokenizer) -> LineTokenizer | None:
        """A line tokenizer for `tokenizer` (a transformers fast tokenizer), or None where lines are not exact."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or backend.normalizer is not None or backend.pre_tokenizer is None:
            return None
        state = json.loads(backend.pre_tokenizer.__getstate__())
        if state.get("type") != "ByteLevel" or not state.get("use_regex"):
            return None
        if any(t.lstrip or t.rstrip or "\n" in t.content for t in backend.get_added_tokens_decoder().values()):
            return None
        plain, special = (backend.encode("x", add_special_tokens=flag).ids for flag in (False, True))
        at = next((i for i in range(len(special) - len(plain) + 1) if special[i:i + len(plain)] == plain), None)
        if at is None:
            return None
        return cls(backend, special[:at], special[at + len(plain):])

    def encode(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_arrays(texts, add_special_tokens)]

    def encode_arrays(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[np.ndarray]:
        """The same ids, one int64 array per text (no Python int per token)."""
        pieces = [split_lines(text) for text in texts]
        new = list(dict.fromkeys(p for lines in pieces for p in lines if p not in self.memo))
        if self.remembered + sum(map(len, new)) > MEMO_CHARS:
            self.memo.clear()
            self.remembered = 0
            new = list(dict.fromkeys(p for lines in pieces for p in lines))
        for line, encoding in zip(new, self.backend.encode_batch_fast(new, add_special_tokens=False)):
            self.memo[line] = np.asarray(encoding.ids, dtype=np.int64)
            self.remembered += len(line)
        head = np.asarray(self.prefix if add_special_tokens else [], dtype=np.int64)
        tail = np.asarray(self.suffix if add_special_tokens else [], dtype=np.int64)
        out = []
        for lines in pieces:
            parts = [head]
            for i, line in enumerate(lines):
                if i:
                    parts.append(self.newline)
                parts.append(self.memo[line])
            parts.append(tail)
            out.append(np.concatenate(parts))
        return out
