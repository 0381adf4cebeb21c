"""A subword tokenizer you can read: a WordPiece vocabulary learned by byte-pair merges.

    tok = Tokenizer.train(sentences, vocab_size=4000)      # seconds on ~10k sentences
    tok.tokenize("unbelievably good")   # ['un', '##bel', '##iev', '##ably', 'good']
    ids, segments = tok.encode("a film", "a movie", max_len=16)   # [CLS] a film [SEP] a movie [SEP] [PAD]..
    tok.decode(ids)                     # 'a film a movie'
    tok.save("vocab.json"); Tokenizer.load("vocab.json")   # plain JSON, no pickle

Three steps turn text into ids:

1. **Words.** Normalise the text to Unicode NFKC (so that "ﬁ", full-width "Ａ" and a letter
   written with a separate combining accent all read as the usual characters; the vocabulary
   learned and the text cut with it are normalised alike), lowercase it (``lowercase=True``),
   then split it into words and single punctuation marks (``split_words``):
   a word is a run of letters, digits, "_" and combining marks, so accents, Devanagari vowel signs
   and viramas stay with their letters; each CJK ideograph is a word of its own, as in BERT's
   basic tokenizer (Chinese is written without spaces; kana and Hangul stay in runs); any other
   character that is not a space is a punctuation mark or a symbol (an emoji with its skin tone,
   variation selector and zero-width-joined parts is one symbol, "👩🏽‍💻", and so are the two
   letters of a flag, "🇫🇷"). "[MASK]" or "[SEP]" written in the text
   are ordinary characters ("[", "mask", "]"): only ``special_tokens=True`` reads them as the
   special tokens (to write a masked sentence by hand).
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

import functools
import json
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from ..files import atomic_write
from .loader import as_count

__all__ = ["PAD", "UNK", "CLS", "SEP", "MASK", "SPECIAL_TOKENS", "Tokenizer", "split_words"]

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)          # ids 0..4, in this order
SPECIAL = r"\[(?:PAD|UNK|CLS|SEP|MASK)\]"
NORMAL_FORM = "NFKC"
# The CJK Unified Ideographs (and extensions, compatibility ideographs) of BERT's basic tokenizer.
CJK = ("\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002b73f"
       "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f")
CONTINUE = "##"
MAX_WORD = 100                                       # longer "words" become [UNK]
FORMAT = "tinymlp-wordpiece"


class Tokenizer:
    """Text <-> token ids with a fixed vocabulary (a list of pieces; the id is the position).

    Text is normalised to Unicode NFKC before it is cut (NFKC rather than NFC: compatibility
    forms such as ligatures and full-width letters become the characters they stand for, so a
    copy-pasted "ﬁlm" is the word "film"; the price is that "²" reads as "2"). Written "[SEP]"
    or "[MASK]" are text unless ``special_tokens=True`` (``tokenize``, ``encode``)."""

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
        """Learn a vocabulary of at most ``vocab_size`` pieces from ``texts`` (an iterable of str; one
        string is refused: it would be read as texts of one character each)."""
        vocab_size = as_count(vocab_size, "Tokenizer.train: vocab_size", minimum=len(SPECIAL_TOKENS) + 1)
        min_frequency = as_count(min_frequency, "Tokenizer.train: min_frequency")
        texts = _texts(texts, "Tokenizer.train: texts")
        counts = Counter(w for t in texts for w in split_words(t, lowercase) if len(w) <= MAX_WORD)
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
    def tokenize(self, text: str, special_tokens: bool = False) -> list:
        """The pieces of ``text``: words cut greedily into the longest known pieces.

        ``special_tokens=True``: "[MASK]", "[SEP]", ... written in ``text`` are those tokens
        (by default they are ordinary text, so that user text can never forge them)."""
        pieces = []
        for word in split_words(text, self.lowercase, special_tokens):
            pieces.extend(self.cut_word(word))
        return pieces

    def cut_word(self, word):
        """One word's pieces: the longest known piece first, then the rest (WordPiece); [UNK] for a
        word no sequence of pieces covers."""
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

    def to_ids(self, text: str, special_tokens: bool = False) -> list:
        return [self.ids[p] for p in self.tokenize(text, special_tokens)]

    def encode(self, text: str, pair: str | None = None, max_len: int | None = 128, special_tokens: bool = False):
        """(ids, segments) of ``[CLS] text [SEP] (pair [SEP])``, cut and padded to ``max_len``.

        Lists of ints; ``max_len=None``: neither cut nor padded. ``special_tokens``: as in
        ``tokenize`` (off: "[SEP]" in the text is not a separator)."""
        if max_len is not None:
            max_len = as_count(max_len, "Tokenizer.encode: max_len")
        a = self.to_ids(text, special_tokens)
        b = self.to_ids(pair, special_tokens) if pair is not None else None
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

    def encode_batch(self, texts, pairs=None, max_len: int | None = 128, special_tokens: bool = False):
        """(ids, segments): int64 arrays (N, max_len); the padding mask is ``ids != tok.pad_id``.
        ``max_len=None``: nothing cut, every row padded to the longest one's length."""
        texts = list(_texts(texts, "Tokenizer.encode_batch: texts"))
        pairs = [None] * len(texts) if pairs is None else list(_texts(pairs, "Tokenizer.encode_batch: pairs", True))
        if len(pairs) != len(texts):
            raise ValueError(f"Tokenizer.encode_batch: {len(texts)} texts but {len(pairs)} pairs")
        rows = [self.encode(t, p, max_len, special_tokens) for t, p in zip(texts, pairs)]
        width = max_len if max_len is not None else max((len(r[0]) for r in rows), default=0)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        segments = np.zeros((len(rows), width), dtype=np.int64)
        for i, (row, segment) in enumerate(rows):
            ids[i, :len(row)], segments[i, :len(segment)] = row, segment
        return ids, segments

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text from ids: continuation pieces glued to the previous piece, words joined by spaces.

        An id outside [0, vocabulary size) is refused with a ValueError (a negative one would
        otherwise read the vocabulary from its end)."""
        ids = [_as_id(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        bad = [i for i in ids if not 0 <= i < len(self.vocab)]
        if bad:
            raise ValueError(f"Tokenizer.decode: id {bad[0]} is outside this tokenizer's vocabulary of "
                             f"{len(self.vocab)} pieces (ids 0..{len(self.vocab) - 1}); decode ids with the tokenizer "
                             "that encoded them")
        out = []
        for i in ids:
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
        """Write the vocabulary as JSON, one piece a line (atomically, by ``tinymlp.files.atomic_write``:
        a folder, a missing or read-only folder, a read-only file are refused naming the path)."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=0) + "\n"
        atomic_write(path, lambda f: f.write(text), what="Tokenizer.save", binary=False)

    @classmethod
    def load(cls, path):
        """Read a file written by ``save``; a file that is not one raises ValueError naming it."""
        path = Path(path)
        try:
            raw = path.read_bytes()
        except IsADirectoryError:
            raise ValueError(f"{path} is a folder, not a tokenizer file: pass the path of the .json file "
                             f"that Tokenizer.save wrote") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise ValueError(f"{path}, line {line}: the bytes are not UTF-8, so this is not a tokenizer file "
                             f"written by Tokenizer.save (or it was damaged)") from None
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}), so "
                             f"this is not a tokenizer file written by Tokenizer.save (or it was damaged)") from None
        return cls.from_dict(payload, source=path, text=text)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": 1, "lowercase": self.lowercase, "vocab": list(self.vocab)}

    @classmethod
    def from_dict(cls, payload, source="the tokenizer", text=None):
        """A tokenizer from ``to_dict``'s dict, every field checked; ``source`` (a file name) is
        named in the error, with the line of a bad piece when ``text`` (the file's text) is given."""
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"{source} is not a tinymlp tokenizer file (no \"format\": \"{FORMAT}\")")
        vocab, lowercase = payload.get("vocab"), payload.get("lowercase", True)
        if not isinstance(lowercase, bool):
            raise ValueError(f"{source}: \"lowercase\" is {lowercase!r}, expected true or false")
        if not isinstance(vocab, list):
            raise ValueError(f"{source}: \"vocab\" is {type(vocab).__name__}, expected a list of pieces (strings)")
        seen = {}
        for i, piece in enumerate(vocab):
            problem = (f"is {piece!r}, not a string" if not isinstance(piece, str) else
                       "is empty" if not piece else
                       f"{piece!r} holds a space" if any(ch.isspace() for ch in piece) else
                       f"{piece!r} repeats piece {seen[piece]}" if piece in seen else None)
            if problem:
                raise ValueError(f"{source}{_line_of(text, i)}: piece {i} of the vocabulary {problem}; "
                                 f"the file was damaged or edited by hand (write it with Tokenizer.save)")
            seen[piece] = i
        if tuple(vocab[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"{source}: the vocabulary must start with {list(SPECIAL_TOKENS)}, it starts "
                             f"with {vocab[:len(SPECIAL_TOKENS)]}")
        return cls(vocab, lowercase)


def _texts(texts, what, none_ok=False):
    """The strings of the iterable ``texts``, one by one; one string (which would be read as texts of
    one character each), or an item that is not a string, is a TypeError naming ``what``."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{what} is one string; give an iterable of texts (a list of lines: text.splitlines(), "
                        "or [text] for one text)")
    for i, text in enumerate(texts):
        if not isinstance(text, str) and not (none_ok and text is None):
            raise TypeError(f"{what}[{i}] is a {type(text).__name__}, not a string")
        yield text


def _as_id(value) -> int:
    """A token id as an int: whole numbers only (a float or a boolean is not an id)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"Tokenizer.decode: ids must be whole numbers, got {value!r} of type {type(value).__name__}")
    return int(value)


def _line_of(text, index):
    """", line N" of the ``index``-th element of the "vocab" list in ``text`` (JSON as ``save``
    writes it: one piece a line), or "" when it cannot be told."""
    if text is None:
        return ""
    lines = text.splitlines()
    try:
        start = next(k for k, line in enumerate(lines) if line.lstrip().startswith('"vocab"'))
    except StopIteration:
        return ""
    k = start + 1 + index
    return f", line {k + 1}" if k < len(lines) and lines[start].rstrip().endswith("[") else ""


_ASCII = re.compile(r"\w+|[^\w\s]", re.ASCII)
_ASCII_SPECIAL = re.compile(rf"{SPECIAL}|\w+|[^\w\s]", re.ASCII)
_CJK = re.compile(f"[{CJK}]")
_CJK_SPLIT = re.compile(f"[{CJK}]|[^{CJK}]+")


@functools.lru_cache(maxsize=2)
def _pattern(special_tokens):
    """Words (runs of letters, digits, "_" and combining marks) and single punctuation marks or
    symbols (an emoji sequence is one symbol: ``SYMBOL``); with
    ``special_tokens``, the special tokens written whole first. Built on first use: the combining
    marks (Unicode categories Mn, Mc, Me) are read from ``unicodedata``, as ranges."""
    ranges, start = [], None
    for c in range(sys.maxunicode + 2):
        mark = c <= sys.maxunicode and unicodedata.category(chr(c)).startswith("M")
        if mark and start is None:
            start = c
        elif not mark and start is not None:
            ranges.append(re.escape(chr(start)) + ("" if c - 1 == start else "-" + re.escape(chr(c - 1))))
            start = None
    word = rf"[\w{''.join(ranges)}]+"
    return re.compile("|".join(([SPECIAL] if special_tokens else []) + [word, EMOJI_FLAG, SYMBOL]))


# A symbol and what belongs to it: an emoji's skin tone, variation selector, keycap and tag
# characters, and the emoji it is joined to by zero-width joiners ("👩🏽‍💻" is one symbol); two
# regional indicators are one flag ("🇫🇷").
_MODIFIER = "[\U0001F3FB-\U0001F3FF\uFE0E\uFE0F\u20E3\U000E0020-\U000E007F]"
SYMBOL = rf"[^\w\s]{_MODIFIER}*(?:\u200D[^\w\s\u200D]{_MODIFIER}*)*"
EMOJI_FLAG = "[\U0001F1E6-\U0001F1FF]{2}"


def split_words(text, lowercase, special_tokens=False):
    """``text`` normalised, lowercased and split into words and punctuation marks, each CJK
    ideograph a word of its own."""
    if not isinstance(text, str):
        raise TypeError(f"Tokenizer: expected a str, got {type(text).__name__}")
    plain = text.isascii()                       # ASCII is already NFKC, without marks or CJK: a faster path
    if not plain:
        text = unicodedata.normalize(NORMAL_FORM, text)
    if lowercase and special_tokens:             # lowercase all but the special tokens
        text = re.sub(rf"{SPECIAL}|[^\[]+|\[",
                      lambda m: m.group() if m.group() in SPECIAL_TOKENS else m.group().lower(), text)
    elif lowercase:
        text = text.lower()
    if plain:
        return (_ASCII_SPECIAL if special_tokens else _ASCII).findall(text)
    words = _pattern(bool(special_tokens)).findall(text)
    if _CJK.search(text):                        # one word per ideograph, as BERT's basic tokenizer
        words = [part for w in words for part in (_CJK_SPLIT.findall(w) if _CJK.search(w) else (w,))]
    return words


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
