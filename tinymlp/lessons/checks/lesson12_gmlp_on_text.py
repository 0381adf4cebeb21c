"""Lesson 12's checks: the embedding's backward, a scatter-add (12.1), the mean over the real tokens
and its backward (12.2), WordPiece's greedy longest-match cut (12.3)."""

from __future__ import annotations

import numpy as np

from ... import tensor
from ..registry import CostCase, Wrong, exercise
from .common import array_of, close, exact, grads, run_gradcheck, shown_as, t64


def embedding_cost(rng):
    table, ids = rng.normal(size=(4096, 64)), rng.integers(0, 4096, size=(16, 32))
    return CostCase((table, ids), (True, False), lambda table, ids: table[ids])


@exercise("12.1", "embedding backward (scatter-add)", answer="MyEmbedding", seed=21, derived=True,
          cost=embedding_cost, reference="tinymlp/ops/embedding.py (Embedding.backward)",
          forbidden=("tinymlp.ops.embedding.Embedding",))
def embedding_backward(cls, case):
    V, C = case.pick((6, 3), (7, 2))
    E = t64(case.rng.normal(size=(V, C)))
    ids = case.pick(np.array([[1, 4, 4, 0], [4, 2, 1, 1]]),      # repeated ids: the sums must accumulate
                    np.array([[5, 5, 2], [0, 5, 6], [2, 2, 2]]))
    En = E.numpy().copy()
    close("forward", cls.apply(E, ids.copy()), En[ids])

    @shown_as(cls)

    def embedding(E):
        return cls.apply(E, ids.copy())

    run_gradcheck(embedding, (E,), case)
    g = case.rng.normal(size=ids.shape + (C,))
    want = np.zeros((V, C))
    np.add.at(want, ids, g)
    exact("dL/dE", grads(embedding, (t64(En),), g)[0], want)


def masked_mean_reference(x, mask):
    m = mask[:, :, None]
    return (x * m).sum(axis=1) / m.sum(axis=1)


def masked_mean_cost(rng):
    x, lengths = rng.normal(size=(32, 128, 64)), rng.integers(1, 129, size=32)
    return CostCase((x, np.arange(128)[None, :] < lengths[:, None]), (True, False), masked_mean_reference)


@exercise("12.2", "mean over the real tokens (masked pooling)", answer="MaskedMean", seed=22, derived=True,
          cost=masked_mean_cost, reference="tinymlp/models/text_gmlp.py (TextGMLP: the mean over the real tokens)")
def masked_mean_backward(cls, case):
    rng = case.rng
    mask = case.pick(np.array([[1, 1, 1, 0, 0, 0],                 # 3 real tokens of 6
                               [1, 1, 1, 1, 1, 1],                 # no padding
                               [1, 0, 0, 0, 0, 0]], dtype=bool),   # [CLS] alone
                     np.array([[1, 1, 0, 0, 0],
                               [1, 1, 1, 1, 0],
                               [1, 0, 0, 0, 0],
                               [1, 1, 1, 1, 1]], dtype=bool))
    (B, S), C = mask.shape, case.pick(4, 3)
    m, n = mask[:, :, None], mask.sum(axis=1, keepdims=True)         # (B, S, 1), (B, 1)
    X = rng.normal(size=(B, S, C))
    x = t64(X.copy())
    y = cls.apply(x, mask.copy())
    got = array_of(y, "forward")
    want = (X * m).sum(axis=1) / n
    if got.shape == want.shape and not np.allclose(got, want):
        if np.allclose(got, (X * m).sum(axis=1) / S):
            raise Wrong(f"forward: divided by S = {S}, the padded length; divide sentence b by "
                        "n[b] = mask[b].sum(), its number of real tokens")
        if np.allclose(got, X.mean(axis=1)):
            raise Wrong("forward: the padding is averaged in; multiply by the mask before summing")
    close("forward", y, want)

    g = rng.normal(size=(B, C))
    y.backward(tensor(g, dtype="float64"))
    dx = array_of(x.grad, "dL/dx")
    want = m * (g / n)[:, None, :]
    if dx.shape == want.shape and not np.allclose(dx, want):
        if np.allclose(dx, m * g[:, None, :] / S):
            raise Wrong(f"backward: divided by S = {S} instead of n[b], the number of real tokens "
                        "(the forward divides by n[b], so the backward must too)")
        if np.allclose(dx, np.broadcast_to(g[:, None, :] / S, dx.shape)):
            raise Wrong(f"backward: that is the gradient of the mean over all S = {S} positions: "
                        "the mask and n[b] are both missing")
        if np.any(dx[~mask] != 0):
            b, s = map(int, np.argwhere((dx != 0).any(axis=-1) & ~mask)[0])
            raise Wrong(f"backward: the mask is missing; the padding position (b={b}, s={s}) gets "
                        f"{np.round(dx[b, s], 4)} but must get exactly 0 (it does not enter y)")

    @shown_as(cls)

    def masked_mean(x):
        return cls.apply(x, mask.copy())

    run_gradcheck(masked_mean, (t64(rng.normal(size=(B, S, C))),), case)  # any other slip: the report says where
    exact("dL/dx", dx, want)
    if np.any(dx[~mask] != 0):
        raise Wrong(f"backward: padding positions must get exactly 0, largest |dL/dx| there "
                    f"{np.abs(dx[~mask]).max():.3g}")


def wordpiece_cases(case):
    """(vocabulary, words) pairs: a small trained one, and one made to show the usual slips."""
    from ...data.tokenizer import Tokenizer

    corpus = ["the players were playing a funny film", "an unbelievably long story was told",
              "she plays the piano and he played along", "a story of stories, told and retold"] * 3
    trained = set(Tokenizer.train(corpus, vocab_size=70).vocab[5:])
    words = ["the", "players", "playing", "plays", "replayed", "unbelievably", "stories", "storyteller",
             "a", "t", "s", "pianos", "along", "longest", "told", "retelling", "hello", "played",
             "jazz", "q", "theplayers", "aaaa"]
    made = {"a", "b", "c", "d", "ab", "abc", "##a", "##b", "##c", "##bc", "##cab", "un", "##do", "do", "##ne"}
    made_words = ["a", "d", "ab", "abc", "abd", "abca", "abcab", "undo", "undone", "undoe", "cab", "bad",
                  "dab", "z", "abcabcab", "ba", "bca"]
    if case.hidden:  # other words over the same vocabularies, drawn from their pieces
        rng = case.rng
        letters = sorted({ch for w in trained for ch in w.replace("##", "")})
        words = ["".join(rng.choice(letters, size=int(rng.integers(1, 9)))) for _ in range(25)]
        made_words = ["".join(rng.choice(list("abcdnoeuz"), size=int(rng.integers(1, 8)))) for _ in range(25)]
    return [(trained, words), (made, made_words)]


def wordpiece_hint(got, want):
    if want == ["[UNK]"] and "[UNK]" in got:
        return "a word with a position where no piece fits is [UNK] as a whole, not the pieces found before it"
    if want != ["[UNK]"] and got == ["[UNK]"]:
        return "every position here has a piece that fits; look at the ## of the later pieces"
    if len(got) > 1 and not any(p.startswith("##") for p in got[1:]):
        return "the pieces after the first continue the word: look them up with ## in front"
    if got and got[0].startswith("##"):
        return "the first piece of a word is plain, without ##"
    if len(got) > len(want):
        return "take the longest prefix that is in the vocabulary, not the shortest"
    return ""


@exercise("12.3", "WordPiece's greedy longest-match cut", answer="wordpiece",
          reference="tinymlp/data/tokenizer.py (Tokenizer.cut_word)",
          forbidden=("tinymlp.data.tokenizer.Tokenizer.cut_word", "tinymlp.data.tokenizer.Tokenizer.encode",
                     "tinymlp.data.tokenizer.Tokenizer.tokenize"))
def wordpiece_cut(wordpiece, case):
    from ...data.tokenizer import SPECIAL_TOKENS, Tokenizer

    for vocab, words in wordpiece_cases(case):
        tok = Tokenizer(list(SPECIAL_TOKENS) + sorted(vocab - set(SPECIAL_TOKENS)))
        for word in words:
            want = tok.cut_word(word)
            got = wordpiece(word, set(vocab))
            if isinstance(got, (tuple, list)) and all(type(p) is str for p in got):
                got = [str(p) for p in got]       # a plain list: no object that compares equal to anything
            elif not isinstance(got, str):
                got = f"a {getattr(got, 'type_name', type(got).__name__)}"
            if got != want:
                hint = wordpiece_hint(got, want) if isinstance(got, list) else "return a list of strings"
                raise Wrong(f"{word!r}: yours {got!r}, the tokenizer's {want!r}" + (f"\n({hint})" if hint else ""))
