"""lab.audit.piece_tokens: a distinct line or sentence at a time gives the ids the whole prompt gives, on both local
tokenizers, for text with every kind of line break, sentence end, space and special token; other tokenizers are
refused."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from lab.audit.piece_tokens import PieceTokenizer, split_pieces
from lab.core.model import ensure_model

PIECES = ["You are a support bot.", "Order 1234567", "  ", " ", "\n", "\n\n", "\t", "é", "订单", "'s", "x",
          "<|im_start|>", "<|im_end|>", "<s>", "Question:", "42.", " ,", ".", "!", "?", "...", " Yes", "? 3", "\u3000",
          "\r", "\u00a0", "\x00"]
texts = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def tokenizer(request):
    path = ensure_model("tiny") if request.param == "tiny" else request.getfixturevalue("smollm2_model")
    return AutoTokenizer.from_pretrained(path)


def test_a_break_is_cut_from_the_text_before_it_only_where_that_text_ends_in_a_character_other_than_whitespace():
    assert split_pieces("a\nb\n c\n\nd \ne") == ["a", "\nb", "\n c", "\n\nd \ne"]
    assert split_pieces("sys.\nUser: hi\nBot:") == ["sys.", "\nUser: hi", "\nBot:"] and split_pieces("") == [""]


def test_a_sentence_is_cut_between_its_end_and_the_space_after_it():
    assert split_pieces("Hi. How are you? Fine! 3.5 is. ok") == ["Hi.", " How are you?", " Fine!", " 3.5 is.", " ok"]
    assert split_pieces("Hi.  Two. \nEnd") == ["Hi.", "  Two.", " \nEnd"]
    assert split_pieces("no\x00cut. here") == ["no\x00cut. here"], "the cut marker in the text: one piece"


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
def test_pieces_give_the_ids_of_whole_prompts(tokenizer, batch):
    pieces = PieceTokenizer.for_tokenizer(tokenizer)
    assert pieces is not None
    for special in (True, False):
        assert pieces.encode(batch, add_special_tokens=special) == \
            tokenizer(batch, add_special_tokens=special)["input_ids"]
    assert pieces.encode(batch) == pieces.encode(batch), "the second time, from the memo"


def test_a_tokenizer_whose_breaks_are_not_boundaries_is_refused(tokenizer):
    from tokenizers import normalizers

    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.backend_tokenizer.normalizer = normalizers.Lowercase()
    assert PieceTokenizer.for_tokenizer(other) is None
