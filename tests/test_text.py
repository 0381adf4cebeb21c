"""tinymlp.data.tokenizer: the subword tokenizer (training, cutting, pairs, padding, JSON files)."""

import json

import numpy as np
import pytest

from tinymlp.data.tokenizer import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, Tokenizer

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
    assert tok.tokenize("the [MASK] play", special_tokens=True) == ["the", MASK, "play"]
    assert tok.encode("the [MASK] play", max_len=None, special_tokens=True)[0][2] == tok.mask_id


def test_special_tokens_written_in_user_text_are_ordinary_text():
    tok = Tokenizer.train(["a b [SEP] [PAD] [MASK] [CLS] [UNK] c"] * 3, vocab_size=60)
    for special in SPECIAL_TOKENS:
        text = f"a {special} b"
        pieces = tok.tokenize(text)
        assert pieces[0] == "a" and pieces[1] == "[" and pieces[-2:] == ["]", "b"]
        ids, segments = tok.encode(text, "c", max_len=16)
        real = ids[1:ids.index(tok.pad_id)]
        assert [i for i in real if i < len(SPECIAL_TOKENS)] == [tok.sep_id, tok.sep_id]   # only the real separators
        assert segments[:len(pieces) + 2] == [0] * (len(pieces) + 2)       # "[SEP]" in a does not start b
    assert tok.tokenize("[sep] [Sep]", special_tokens=True) == ["[", "sep", "]", "[", "sep", "]"]


def test_unicode_is_normalised_nfkc():
    tok = Tokenizer.train(["café fine abc"] * 3, vocab_size=80)
    assert tok.tokenize("cafe\u0301") == tok.tokenize("caf\u00e9") == ["café"]   # combining accent = precomposed
    assert tok.tokenize("\ufb01ne") == ["fine"]                                     # the ligature "fi"
    assert tok.tokenize("\uff21\uff22\uff23") == ["abc"]                          # full-width letters
    assert UNK not in tok.tokenize("CAFE\u0301")


def test_combining_marks_and_indic_scripts_stay_with_their_letters():
    words = ["नमस्ते", "हिन्दी", "क्षमा", "naïve", "tiếng"]
    tok = Tokenizer.train([" ".join(words)] * 3, vocab_size=200, min_frequency=1)
    for word in words:
        assert tok.tokenize(word) == [word]          # one word: no vowel sign or virama cut off
        assert tok.decode(tok.to_ids(f"{word} {word}")) == f"{word} {word}"
    mark = "\u094d"                                    # a virama alone is still not punctuation
    assert Tokenizer.train([f"{mark} x"] * 3, vocab_size=20).tokenize(f"x{mark}") == [UNK]


def test_cjk_is_cut_per_ideograph_as_in_bert():
    tok = Tokenizer.train(["我爱北京天安门", "北京 东京タワー"] * 3, vocab_size=200, min_frequency=1)
    assert tok.tokenize("我爱北京") == ["我", "爱", "北", "京"]
    assert tok.tokenize("东京タワー") == ["东", "京", "タワー"]          # kana stay in a run, as in BERT
    assert all(len(p.removeprefix("##")) == 1 for p in tok.vocab[5:] if "\u4e00" <= p[-1] <= "\u9fff")


@pytest.mark.parametrize("content, message", [
    (b'{"format": "tinymlp-wordpiece", "vocab": [\n"[PAD]",\n', r"bad\.json, line 3, column 1: not valid JSON"),
    (b'{"format": "tinymlp-wordpiece",\n "vocab": ["\xff"]}', r"bad\.json, line 2: the bytes are not UTF-8"),
    (b'{"format": "tinymlp-wordpiece", "vocab": "abc"}', r"bad\.json: \"vocab\" is str"),
    (b'{"format": "tinymlp-wordpiece", "lowercase": "yes", "vocab": []}', r"bad\.json: \"lowercase\" is 'yes'"),
    (b'{"format": "tinymlp-wordpiece", "vocab": ["[PAD]", "[UNK]"]}', r"bad\.json: the vocabulary must start"),
])
def test_malformed_vocab_files_name_the_file(tmp_path, content, message):
    (tmp_path / "bad.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        Tokenizer.load(tmp_path / "bad.json")


def test_a_bad_piece_names_its_line(tok, tmp_path):
    path = tmp_path / "vocab.json"
    tok.save(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    k = lines.index('"the",')
    lines[k] = '"play",'                                 # a repeated piece, as a hand edit would make
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"vocab\.json, line {k + 1}: piece {tok.vocab.index('the')} of the "
                                         rf"vocabulary 'play' repeats piece {tok.vocab.index('play')}"):
        Tokenizer.load(path)
    lines[k] = '17,'
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"line {k + 1}: piece \d+ of the vocabulary is 17, not a string"):
        Tokenizer.load(path)


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
