"""tinymlp.text: the subword tokenizer (training, cutting, pairs, padding, JSON files)."""

import json

import numpy as np
import pytest

from tinymlp.text import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, Tokenizer

CORPUS = ["the players were playing and the player played",
          "a playful play, played again!", "replay the plays"] * 5


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(CORPUS, vocab_size=60)


def test_specials_come_first(tok):
    assert tok.vocab[:5] == list(SPECIAL_TOKENS) == [PAD, UNK, CLS, SEP, MASK]
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert len(tok) <= 60


def test_frequent_words_become_pieces(tok):
    assert {"play", "##lay", "playing", "the"} <= set(tok.vocab)          # merged pieces, whole words
    assert tok.tokenize("The PLAYERS!") == ["the", "players", "!"]
    assert tok.tokenize("replaying playfully") == ["replay", "##in", "##g", "playful", "##l", "##y"]


def test_unknown_characters_and_special_tokens(tok):
    assert tok.tokenize("zebra") == [UNK]            # 'z' never seen: the whole word is unknown
    assert tok.tokenize("the [MASK] play") == ["the", MASK, "play"]


def test_every_piece_sequence_decodes_back(tok):
    text = "the players replay a playful play"
    ids, segments = tok.encode(text, max_len=None)
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and set(segments) == {0}
    assert tok.decode(ids) == text


def test_pairs_truncation_and_padding(tok):
    ids, seg = tok.encode("play play play play play", "the", max_len=8)
    assert len(ids) == len(seg) == 8
    assert ids == [tok.cls_id] + tok.to_ids("play play play play") + [tok.sep_id] + tok.to_ids("the") + [tok.sep_id]
    assert seg == [0] * 6 + [1] * 2
    ids, seg = tok.encode("play", "the", max_len=10)
    assert ids[-4:] == [tok.pad_id] * 4 and seg[-4:] == [0] * 4
    batch, segments = tok.encode_batch(["play", "the play"], ["a", "b"], max_len=12)
    assert batch.shape == segments.shape == (2, 12) and batch.dtype == np.int64
    with pytest.raises(ValueError, match="max_len"):
        tok.encode("play", "the", max_len=2)


def test_default_length_is_128(tok):
    assert len(tok.encode("play")[0]) == 128


def test_json_round_trip(tok, tmp_path):
    path = tmp_path / "vocab.json"
    tok.save(path)
    payload = json.loads(path.read_text())
    assert payload["format"] == "tinymlp-wordpiece" and payload["vocab"] == tok.vocab
    again = Tokenizer.load(path)
    assert again.vocab == tok.vocab and again.encode("players play") == tok.encode("players play")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a tinymlp tokenizer"):
        Tokenizer.load(tmp_path / "bad.json")


def test_training_is_deterministic_and_fast_enough():
    texts = [" ".join(f"w{i % 97}x{i % 13}" for i in range(k, k + 20)) for k in range(500)]
    a, b = Tokenizer.train(texts, vocab_size=300), Tokenizer.train(texts, vocab_size=300)
    assert a.vocab == b.vocab and len(a) == 300
