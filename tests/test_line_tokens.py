"""lab.audit.line_tokens: a distinct line at a time gives the ids the whole prompt gives, on both local tokenizers,
for text with every kind of line break, space and special token; other tokenizers are refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from lab.audit.line_tokens import LineTokenizer, split_lines
from lab.core.model import ensure_model

PIECES = ["You are a support bot.", "Order 1234567", "  ", " ", "\n", "\n\n", "\t", "é", "订单", "'s", "x",
          "<|im_start|>", "<|im_end|>", "<s>", "Question:", "42.", " ,"]
texts = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer(request):
    return AutoTokenizer.from_pretrained(ensure_model(request.param))


def test_a_break_is_cut_only_between_two_characters_that_are_not_whitespace():
    assert split_lines("a\nb\n c\n\nd \ne") == ["a", "b\n c\n\nd \ne"]
    assert split_lines("sys.\nUser: hi\nBot:") == ["sys.", "User: hi", "Bot:"] and split_lines("") == [""]


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
def test_lines_give_the_ids_of_whole_prompts(tokenizer, batch):
    lines = LineTokenizer.for_tokenizer(tokenizer)
    assert lines is not None
    for special in (True, False):
        assert lines.encode(batch, add_special_tokens=special) == \
            tokenizer(batch, add_special_tokens=special)["input_ids"]
    assert lines.encode(batch) == lines.encode(batch), "the second time, from the memo"


def test_a_tokenizer_whose_breaks_are_not_boundaries_is_refused(tokenizer):
    from tokenizers import normalizers

    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.backend_tokenizer.normalizer = normalizers.Lowercase()
    assert LineTokenizer.for_tokenizer(other) is None
