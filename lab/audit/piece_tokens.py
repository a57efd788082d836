"""Tokenizing a log a piece at a time: each distinct line or sentence once, however many prompts
repeat it.

A log repeats itself: the same system prompt, template, retrieved passage or canned sentence in
thousands of requests, and every turn of a chat sends the turns before it again. Tokenizing whole
prompts costs the same for all of it; here a prompt is cut into pieces where a token boundary is
certain, each piece is tokenized the first time it is seen, and its ids are reused after, so the
cost follows the new text.

The cuts are exact only for byte-level BPE with GPT-2's split pattern (SmolLM2's tokenizer, and the
lab's own), no normalizer and no prefix space. No alternative of that pattern matches a character
other than whitespace followed by whitespace, so between the two a match always ends and the next
one starts. The cuts are two such places: before a line break that follows text, and between a
sentence's end (".", "!", "?") and the space after it. BPE merges only within a match, so the
prompt's ids are its pieces' ids one after another. (A cut between two whitespace characters would
not be exact: " \\n " before a word makes the matches " \\n" and " word".)
`PieceTokenizer.for_tokenizer` returns None for any other tokenizer (a normalizer, another split
pattern, a prefix space, an added token that strips whitespace or holds a cut), and the caller
tokenizes whole prompts. The tests compare both ways on generated text for both local tokenizers.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence

import numpy as np

# characters of distinct pieces remembered (their ids: about 128 MB) before starting again
MEMO_CHARS = 64_000_000
_BREAK_AFTER_TEXT = re.compile(
    r"\n(?<=\S\n)"
)  # a line break right after a character that is not whitespace
_CUT = "\x00"


def split_pieces(text: str) -> list[str]:
    """`text` cut where a token boundary is certain: before a line break that follows a character
    other than whitespace, and between a sentence's ".", "!" or "?" and the space after it. (Text
    holding a NUL character, which marks the cuts here, is one piece.)"""
    if _CUT in text:
        return [text]
    marked = _BREAK_AFTER_TEXT.sub(_CUT + "\n", text)
    for end in ".!?":
        marked = marked.replace(end + " ", end + _CUT + " ")
    return marked.split(_CUT)


class PieceTokenizer:
    """`encode(texts)`: the ids the Rust tokenizer gives each whole text, computed a distinct piece
    at a time."""

    def __init__(self, backend, prefix: list[int], suffix: list[int]) -> None:
        self.backend = backend
        self.prefix, self.suffix = (np.asarray(ids, dtype=np.int64) for ids in (prefix, suffix))
        self.memo: dict[str, np.ndarray] = {}
        self.remembered = 0

    @classmethod
    def for_tokenizer(cls, tokenizer) -> PieceTokenizer | None:
        """A piece tokenizer for `tokenizer` (a transformers fast tokenizer), or None where pieces
        are not exact."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or backend.normalizer is not None or backend.pre_tokenizer is None:
            return None
        state = json.loads(backend.pre_tokenizer.__getstate__())
        if (
            state.get("type") != "ByteLevel"
            or not state.get("use_regex")
            or state.get("add_prefix_space")
        ):
            return None
        if any(
            t.lstrip or t.rstrip or split_pieces(t.content) != [t.content]
            for t in backend.get_added_tokens_decoder().values()
        ):
            return None
        plain, special = (
            backend.encode("x", add_special_tokens=flag).ids for flag in (False, True)
        )
        at = next(
            (
                i
                for i in range(len(special) - len(plain) + 1)
                if special[i : i + len(plain)] == plain
            ),
            None,
        )
        if at is None:
            return None
        return cls(backend, special[:at], special[at + len(plain) :])

    def encode(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_arrays(texts, add_special_tokens)]

    def encode_arrays(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[np.ndarray]:
        """The same ids, one int64 array per text (views of one array for the batch: no Python int
        per token)."""
        if not texts:
            return []
        pieces = [split_pieces(text) for text in texts]
        self._learn(pieces)
        head, tail = (self.prefix, self.suffix) if add_special_tokens else (self.prefix[:0],) * 2
        parts = []
        for text_pieces in pieces:
            parts.append(head)
            parts.extend(map(self.memo.__getitem__, text_pieces))
            parts.append(tail)
        sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
        first_parts = np.cumsum(
            [0] + [len(p) + 2 for p in pieces[:-1]]
        )  # each text's head among the parts
        lengths = np.add.reduceat(sizes, first_parts)
        return np.split(np.concatenate(parts), np.cumsum(lengths)[:-1])

    def _learn(self, pieces: list[list[str]]) -> None:
        """Tokenize the pieces not yet in the memo, each once (the memo starts again past
        MEMO_CHARS)."""
        new = list(
            dict.fromkeys(
                itertools.filterfalse(self.memo.__contains__, itertools.chain.from_iterable(pieces))
            )
        )
        if self.remembered + sum(map(len, new)) > MEMO_CHARS:
            self.memo.clear()
            self.remembered = 0
            new = list(dict.fromkeys(itertools.chain.from_iterable(pieces)))
        for piece, encoding in zip(
            new, self.backend.encode_batch_fast(new, add_special_tokens=False)
        ):
            self.memo[piece] = np.asarray(encoding.ids, dtype=np.int64)
            self.remembered += len(piece)


class TokenEncoder:
    """The token ids of texts, as `tokenizer(texts)["input_ids"]` gives them: a distinct line or
    sentence at a time where that is exact (a PieceTokenizer, whose memo lives as long as this
    encoder: make one per reading), else through the Rust tokenizer's batch call without offsets or
    attention masks when there is one (several times faster on long prompts), else the tokenizer's
    own call."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pieces = PieceTokenizer.for_tokenizer(tokenizer)

    def ids(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if not texts:
            return []
        if self.pieces is not None:
            return self.pieces.encode(texts, add_special_tokens=add_special_tokens)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_batch_fast"):
            return [
                e.ids
                for e in backend.encode_batch_fast(
                    list(texts), add_special_tokens=add_special_tokens
                )
            ]
        return self.tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]

    def arrays(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[np.ndarray]:
        """`ids` as one int64 array per text, for callers that hold many."""
        if self.pieces is not None and texts:
            return self.pieces.encode_arrays(texts, add_special_tokens=add_special_tokens)
        return [np.asarray(ids, dtype=np.int64) for ids in self.ids(texts, add_special_tokens)]
