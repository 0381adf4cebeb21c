"""A subword tokenizer you can read: a WordPiece vocabulary learned by byte-pair merges.

    tok = Tokenizer.train(sentences, vocab_size=4000)      # seconds on ~10k sentences
    tok.tokenize("unbelievably good")   # ['un', '##bel', '##iev', '##ably', 'good']
    ids, segments = tok.encode("a film", "a movie", max_len=16)   # [CLS] a film [SEP] a movie [SEP] [PAD]..
    tok.decode(ids)                     # 'a film a movie'
    tok.save("vocab.json"); Tokenizer.load("vocab.json")   # plain JSON, no pickle

Three steps turn text into ids:

1. **Words.** Lowercase (``lowercase=True``), then split into words and single punctuation
   marks (the regular expression ``WORD``). The special tokens written in text, e.g.
   "[MASK]", stay whole.
2. **Subwords.** A word is cut into the longest pieces found in the vocabulary, left to right
   (greedy longest match, as BERT's WordPiece does). A piece that continues a word carries the
   prefix "##", so "playing" -> "play", "##ing", and decoding knows where words end. A word
   that cannot be cut (a character never seen in training) becomes [UNK].
3. **Sequences.** ``[CLS] a [SEP]`` for one sentence, ``[CLS] a [SEP] b [SEP]`` for a pair,
   with segment ids 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``; cut to ``max_len`` (the longer
   sentence loses its last piece first) and padded with [PAD] (id 0) to exactly ``max_len``:
   the spatial gating unit's S x S matrix is tied to one sequence length (128 in the course work).

Training (``Tokenizer.train``): start from single characters (a word-initial form "p" and a
continuation form "##p"), count the adjacent pairs of pieces over the corpus' words weighted by
word frequency, merge the most frequent pair into a new piece ("p" + "##l" -> "pl"), update the
counts of the words that contained it, and repeat until ``vocab_size`` pieces or no pair occurs
``min_frequency`` times. That is byte-pair encoding's training (Sennrich et al. 2016); the pieces
it yields are used as a WordPiece vocabulary.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

__all__ = ["PAD", "UNK", "CLS", "SEP", "MASK", "SPECIAL_TOKENS", "Tokenizer"]

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)          # ids 0..4, in this order
WORD = re.compile(r"\[(?:PAD|UNK|CLS|SEP|MASK)\]|\w+|[^\w\s]")
CONTINUE = "##"
MAX_WORD = 100                                       # longer "words" become [UNK]
FORMAT = "tinymlp-wordpiece"


class Tokenizer:
    """Text <-> token ids with a fixed vocabulary (a list of pieces; the id is the position)."""

    def __init__(self, vocab, lowercase: bool = True):
        vocab = list(vocab)
        if tuple(vocab[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"Tokenizer: the vocabulary must start with {SPECIAL_TOKENS}, got {vocab[:5]}")
        if len(set(vocab)) != len(vocab):
            raise ValueError("Tokenizer: the vocabulary has repeated pieces")
        self.vocab = vocab
        self.ids = {piece: i for i, piece in enumerate(vocab)}
        self.lowercase = bool(lowercase)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = range(len(SPECIAL_TOKENS))

    def __len__(self):
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __repr__(self):
        return f"Tokenizer({len(self)} pieces, lowercase={self.lowercase})"

    # ------------------------------------------------------------------ training
    @classmethod
    def train(cls, texts, vocab_size: int = 8000, min_frequency: int = 2, lowercase: bool = True):
        """Learn a vocabulary of at most ``vocab_size`` pieces from ``texts`` (an iterable of str)."""
        counts = Counter(w for t in texts for w in _words(t, lowercase) if w not in SPECIAL_TOKENS
                         and len(w) <= MAX_WORD)
        words = [[w[0]] + [CONTINUE + c for c in w[1:]] for w in counts]   # each word as its characters
        freq = list(counts.values())
        vocab = list(SPECIAL_TOKENS) + sorted({p for w in words for p in w})
        if len(vocab) > vocab_size:
            raise ValueError(f"Tokenizer.train: the corpus has {len(vocab) - 5} distinct characters, more "
                             f"than vocab_size={vocab_size} allows; raise vocab_size")
        pairs, where = Counter(), defaultdict(set)    # pair -> weighted count, pair -> words holding it
        for i, w in enumerate(words):
            for pair in zip(w, w[1:]):
                pairs[pair] += freq[i]
                where[pair].add(i)
        known = set(vocab)
        while len(vocab) < vocab_size and pairs:
            best, n = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
            if n < min_frequency:
                break
            a, b = best
            merged = a + b[len(CONTINUE):]           # "pl" + "##ay" -> "play", "##pl" + "##ay" -> "##play"
            for i in list(where[best]):
                w = words[i]
                for pair in zip(w, w[1:]):           # take the word's pairs out, merge, put them back
                    pairs[pair] -= freq[i]
                    if pairs[pair] <= 0:
                        del pairs[pair]
                    where[pair].discard(i)
                words[i] = w = _merge(w, a, b, merged)
                for pair in zip(w, w[1:]):
                    pairs[pair] += freq[i]
                    where[pair].add(i)
            if merged not in known:
                known.add(merged)
                vocab.append(merged)
        return cls(vocab, lowercase)

    # ------------------------------------------------------------------ text -> pieces -> ids
    def tokenize(self, text: str) -> list:
        """The pieces of ``text``: words cut greedily into the longest known pieces."""
        pieces = []
        for word in _words(text, self.lowercase):
            pieces.extend(self._cut(word))
        return pieces

    def _cut(self, word):
        if word in self.ids:
            return [word]
        if len(word) > MAX_WORD:
            return [UNK]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:                       # the longest piece that is in the vocabulary
                piece = word[start:end] if start == 0 else CONTINUE + word[start:end]
                if piece in self.ids:
                    break
                end -= 1
            if end == start:
                return [UNK]                         # no piece fits: the whole word is unknown
            pieces.append(piece)
            start = end
        return pieces

    def to_ids(self, text: str) -> list:
        return [self.ids[p] for p in self.tokenize(text)]

    def encode(self, text: str, pair: str | None = None, max_len: int | None = 128):
        """(ids, segments) of ``[CLS] text [SEP] (pair [SEP])``, cut and padded to ``max_len``.

        Lists of ints; ``max_len=None``: neither cut nor padded."""
        a, b = self.to_ids(text), (self.to_ids(pair) if pair is not None else None)
        if max_len is not None:
            specials = 3 if b is not None else 2
            if max_len < specials:
                raise ValueError(f"Tokenizer.encode: max_len={max_len} leaves no room for the text")
            while len(a) + len(b or ()) > max_len - specials:   # longest first, from the end
                (a if b is None or len(a) >= len(b) else b).pop()
        ids = [self.cls_id] + a + [self.sep_id]
        segments = [0] * len(ids)
        if b is not None:
            ids += b + [self.sep_id]
            segments += [1] * (len(b) + 1)
        if max_len is not None:
            pad = max_len - len(ids)
            ids, segments = ids + [self.pad_id] * pad, segments + [0] * pad
        return ids, segments

    def encode_batch(self, texts, pairs=None, max_len: int = 128):
        """(ids, segments): int64 arrays (N, max_len); the padding mask is ``ids != tok.pad_id``."""
        pairs = [None] * len(texts) if pairs is None else pairs
        if len(pairs) != len(texts):
            raise ValueError(f"Tokenizer.encode_batch: {len(texts)} texts but {len(pairs)} pairs")
        rows = [self.encode(t, p, max_len) for t, p in zip(texts, pairs)]
        ids = np.array([r[0] for r in rows], dtype=np.int64).reshape(len(rows), max_len)
        segments = np.array([r[1] for r in rows], dtype=np.int64).reshape(len(rows), max_len)
        return ids, segments

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text from ids: continuation pieces glued to the previous piece, words joined by spaces."""
        out = []
        for i in (int(i) for i in ids):
            piece = self.vocab[i]
            if skip_special and piece in SPECIAL_TOKENS:
                continue
            if piece.startswith(CONTINUE) and out:
                out[-1] += piece[len(CONTINUE):]
            else:
                out.append(piece)
        return " ".join(out)

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the vocabulary as JSON (atomically: a temporary file renamed into place)."""
        path = Path(path)
        payload = {"format": FORMAT, "version": 1, "lowercase": self.lowercase, "vocab": self.vocab}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(payload, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path):
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{path} is not a tinymlp tokenizer file (no \"format\": \"{FORMAT}\")")
        return cls(payload["vocab"], payload.get("lowercase", True))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": 1, "lowercase": self.lowercase, "vocab": list(self.vocab)}

    @classmethod
    def from_dict(cls, payload):
        return cls(payload["vocab"], payload.get("lowercase", True))


def _words(text, lowercase):
    if lowercase:
        text = WORD.sub(lambda m: m.group() if m.group() in SPECIAL_TOKENS else m.group().lower(), text)
    return WORD.findall(text)


def _merge(word, a, b, merged):
    """``word`` (a list of pieces) with every adjacent (a, b) replaced by ``merged``."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
