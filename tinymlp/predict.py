"""Use a trained model: classify images or texts with nothing but its checkpoint.

    python -m tinymlp predict runs/pets photo.jpg holiday/ --top 3     # image files and folders
    python -m tinymlp predict runs/reviews --text "a fine film" reviews.txt --json

    predictor = load("runs/pets")              # a run folder (its best.npz, else checkpoint.npz) or a file
    predictor.predict(images)                  # uint8 (N, H, W, C) or (N, C, H, W), or floats in [0, 1]
    predictor.predict(["a fine film"])         # a text model: strings (or (text, pair) tuples)
    predictor.probabilities(images)            # (N, K) NumPy array, rows summing to 1
    predict("runs/pets", images, top=2)        # the same in one call

What a checkpoint of the example scripts carries for this, in its metadata: the class names, and
``preprocess``: for images the size they were read at (``size``), the per-channel ``mean`` and
``std`` they were normalised with and the model's input size (``image_size``); for text the
sequence length (the tokenizer is stored beside it, ``tokenizer``). A prediction goes through the
pipeline the run's own evaluation used: an image file is decoded to RGB and resized bilinearly to
``size`` (as ``ImageFolder`` reads a training image), scaled to [0, 1], normalised, resized to
``image_size`` on the device; a text is cut into the run's tokens, ``[CLS] text [SEP]`` padded to
the sequence length. Each result is ``{"input", "class", "probability", "top"}``, ``top`` holding
the ``top`` most probable classes, most probable first.

Every problem is one sentence: a file that is not a checkpoint of the example scripts, a masked-LM
checkpoint (it has no classes), an image that cannot be read, texts given to an image model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import checkpoint, models
from .grad_mode import no_grad
from .backend import CudaUnavailableError, memory_limit, to_device
from .checkpoint import CheckpointError
from .data import DatasetError, Tokenizer
from .data.folder import IMAGE_SUFFIXES, as_images, read_image, resize_images
from .data.loader import DataLoader, ImageDataset, as_count
from .data.text_loader import TokenDataset, TokenLoader
from .data.transforms import Compose, Normalize, Resize
from .files import npz_headers
from .nn import Module

__all__ = ["CHECKPOINT_NAMES", "PredictError", "Predictor", "architecture", "checkpoint_path", "load", "load_model",
           "main", "model_class", "predict", "preprocessing_problem", "printable"]

CHECKPOINT_NAMES = ("best.npz", "checkpoint.npz")      # what a run folder is read from, in this order


class PredictError(ValueError):
    """A request predict cannot answer: texts for an image model, a checkpoint without classes, ..."""


# ---------------------------------------------------------------------- the model of a checkpoint
def checkpoint_path(path) -> Path:
    """The checkpoint file ``path`` names: the file itself, or a run folder's best.npz (the best
    validation epoch), else its checkpoint.npz (the last epoch)."""
    path = Path(path)
    if path.is_dir():
        for name in CHECKPOINT_NAMES:
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path}: a folder without {' or '.join(CHECKPOINT_NAMES)}; give a run's --out "
                              "folder or a checkpoint file")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    return path


def model_class(name):
    """A model class of tinymlp.models named in a checkpoint (only those: a name read from a file
    never selects anything else)."""
    cls = getattr(models, name, None) if isinstance(name, str) and name in models.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise CheckpointError(f"the checkpoint names the model class {name!r}, which is not one of tinymlp.models")
    return cls


def architecture(meta):
    """(model class, constructor keywords) of a checkpoint: its preset's class with its config, or
    (fine-tuned runs) its model class with its config."""
    if meta["preset"] in models.PRESETS:
        return models.config(meta["preset"], **meta["model_config"])
    return model_class(meta.get("model_class")), dict(meta["model_config"])


def load_model(path, device="cpu"):
    """(model in evaluation mode on ``device``, metadata) of a checkpoint of the example scripts."""
    path = checkpoint_path(path)
    meta = checkpoint.read_meta(path)
    if not isinstance(meta.get("model_config"), dict) or "preset" not in meta:
        raise CheckpointError(f"{path}: a tinymlp checkpoint, but not one of the example scripts (its metadata "
                              "names no preset and model_config): load it with tinymlp.checkpoint.load into the "
                              "model it was saved from")
    cls, kwargs = architecture(meta)
    _check_size(path, meta, device)
    try:
        model = cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its model_config does not make a {cls.__name__} ({err})") from None
    except MemoryError:
        raise CheckpointError(f"{path}: not enough memory to build its {cls.__name__}") from None
    checkpoint.load(path, model)
    return model.to(device).eval(), meta


def _check_size(path, meta, device):
    """Before a model is built: its config must describe no more parameters than the file holds (a
    damaged or edited config could ask for terabytes), and loading it (the file's arrays and the
    model's, side by side) must fit in the memory this process may use on ``device``."""
    arrays = {k: v for k, v in npz_headers(path).items() if k.startswith("model/")}
    held = sum(math.prod(shape) for shape, _ in arrays.values())
    held_bytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype in arrays.values())
    if meta["preset"] in models.PRESETS:
        try:
            described = models.num_parameters(meta["preset"], **meta["model_config"])
        except Exception:          # a config the constructor refuses: it says why
            described = None
        if described is not None and described > held:
            raise CheckpointError(f"{path}: its model_config describes a model of {described:,} parameters, but the "
                                  f"file holds {held:,}: a damaged or edited checkpoint")
    available, where = memory_limit(device)
    if available is not None and 2 * held_bytes > available:
        raise CheckpointError(f"{path}: its model ({held:,} parameters) needs about {_size(2 * held_bytes)} to load, "
                              f"more than the {_size(available)} {where}")


def _size(n) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


# ---------------------------------------------------------------------- what a checkpoint's preprocessing may be
def preprocessing_problem(kind, mean=None, std=None, size=None, image_size=None, seq_len=None, paired=None):
    """What is wrong with a preprocessing record (a checkpoint's ``preprocess``), in a sentence, or
    None: per-channel ``mean`` and ``std`` of 3 finite numbers (``std`` positive), ``size`` and
    ``image_size`` whole numbers of pixels, a text model's ``seq_len`` a whole number of tokens."""
    def whole(value):
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1

    if kind == "text":
        if not whole(seq_len) or seq_len < 3:
            return f"its preprocessing's seq_len is {seq_len!r} (expected a whole number of tokens, at least 3)"
        if paired not in (None, True, False):
            return f"its preprocessing's paired is {paired!r} (expected true or false)"
        return None
    for name, values in (("mean", mean), ("std", std)):
        if values is None:
            continue
        if not isinstance(values, (list, tuple, np.ndarray)) or len(values) != 3:
            count = f"has {len(values)} values" if isinstance(values, (list, tuple, np.ndarray)) else f"is {values!r}"
            return f"its preprocessing's {name} {count} (expected 3, one per channel)"
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not math.isfinite(v) \
                    or (name == "std" and v <= 0):
                shown = f"{v:g}" if isinstance(v, (int, float, np.number)) and not isinstance(v, bool) else repr(v)
                expected = "positive finite numbers" if name == "std" else "finite numbers"
                return f"its preprocessing's {name} holds {shown} (expected {expected})"
    if size is not None and not whole(size):
        return f"its preprocessing's size is {size!r} (expected a whole number of pixels, at least 1)"
    sides = image_size if isinstance(image_size, (tuple, list)) else (image_size,)
    if image_size is not None and (len(sides) not in (1, 2) or not all(whole(side) for side in sides)):
        return f"its preprocessing's image_size is {image_size!r} (expected a whole number of pixels, or two)"
    return None


def _outputs(model):
    """The number of classes a classifier's head gives (None when its config does not say)."""
    config = getattr(model, "config", None)
    outputs = config.get("num_classes") if isinstance(config, dict) else None
    return outputs if isinstance(outputs, int) and outputs > 0 else None


# ---------------------------------------------------------------------- the predictor
class Predictor:
    """A trained classifier with the preprocessing its run used (see the module docstring).

    ``Predictor.from_checkpoint(path)`` (or ``load(path)``) reads everything from a checkpoint; the
    keywords ``mean``, ``std``, ``size`` and ``image_size`` override its ``preprocess`` record
    (a checkpoint written before it was kept needs them)."""

    def __init__(self, model, classes, *, tokenizer=None, seq_len=None, paired=None, mean=None, std=None, size=None,
                 image_size=None, source="the model", batch_size=256):
        self.model, self.classes, self.source = model, [str(c) for c in classes], source
        self.tokenizer, self.seq_len, self.paired = tokenizer, seq_len, paired
        self.kind = "text" if tokenizer is not None else "image"
        self.mean, self.std, self.size, self.image_size = mean, std, size, image_size
        self.batch_size = as_count(batch_size, "Predictor: batch_size")
        if self.kind == "image" and (mean is None or std is None or size is None):
            raise PredictError(f"{source} does not record the preprocessing of its images (mean, std, size), "
                               "which a checkpoint of the example scripts keeps in meta['preprocess']: pass "
                               "mean=, std= and size= to Predictor")
        problem = preprocessing_problem(self.kind, mean=mean, std=std, size=size, image_size=image_size,
                                        seq_len=seq_len)
        if problem:
            raise PredictError(f"{source}: {problem}")
        outputs = _outputs(model)
        if outputs is not None and outputs != len(self.classes):
            raise PredictError(f"{source}: {len(self.classes)} class names for a model of {outputs} outputs")

    @classmethod
    def from_checkpoint(cls, path, device="cpu", **overrides):
        path = checkpoint_path(path)
        meta = checkpoint.read_meta(path)
        config = meta.get("model_config") if isinstance(meta.get("model_config"), dict) else {}
        if config.get("lm_head"):
            raise PredictError(f"{path} is a masked language model (examples/pretrain_mlm.py): it predicts hidden "
                               "words, not classes; fine-tune it into a classifier with examples/train_text_gmlp.py "
                               f"--pretrained {path}")
        classes = meta.get("classes")
        if not classes or not isinstance(classes, list):
            raise PredictError(f"{path}: the checkpoint names no classes, so its outputs cannot be named")
        outputs = config.get("num_classes")
        if outputs is not None and outputs != len(classes):
            raise CheckpointError(f"{path} names {len(classes)} classes ({', '.join(map(str, classes))}) but its "
                                  f"model has {outputs} outputs: a damaged or edited checkpoint")
        pre = meta.get("preprocess") if isinstance(meta.get("preprocess"), dict) else {}
        if "tokenizer" in meta:
            settings = dict(seq_len=pre.get("seq_len", config.get("seq_len")), paired=pre.get("paired"))
        else:
            size = pre.get("image_size", config.get("image_size"))
            settings = dict(mean=pre.get("mean"), std=pre.get("std"), size=pre.get("size"),
                            image_size=tuple(size) if isinstance(size, list) else size)
        recorded = {**settings, **{k: v for k, v in overrides.items() if k in settings}}
        problem = preprocessing_problem("text" if "tokenizer" in meta else "image", **recorded)
        settings = {**settings, **overrides}          # and the predictor's own options (batch_size)
        if problem:
            raise CheckpointError(f"{path}: {problem}")
        model, meta = load_model(path, device)
        if "tokenizer" in meta:
            try:
                tokenizer = Tokenizer.from_dict(meta["tokenizer"], source=f"{path}: its stored tokenizer")
            except ValueError as err:
                raise CheckpointError(str(err)) from None
            return cls(model, classes, tokenizer=tokenizer, source=str(path), **settings)
        return cls(model, classes, source=str(path), **settings)

    def __repr__(self):
        what = f"{len(self.classes)} classes"
        if self.kind == "text":
            return f"Predictor({type(self.model).__name__}, {what}, texts of {self.seq_len} tokens, from {self.source})"
        return f"Predictor({type(self.model).__name__}, {what}, {self.size} px images, from {self.source})"

    # ------------------------------------------------------------------ probabilities
    def probabilities(self, inputs) -> np.ndarray:
        """(N, K) class probabilities of ``inputs``: images (an array, or a list of image files) for
        an image model; strings or (text, pair) tuples for a text model."""
        loader = self._text_loader(inputs) if self.kind == "text" else self._image_loader(inputs)
        device = next(iter(self.model.parameters())).device
        rows = []
        was_training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                for x, _ in loader:
                    logits = to_device(self.model(x.to(device)).data, "cpu").astype(np.float64)
                    logits -= logits.max(axis=1, keepdims=True)
                    p = np.exp(logits)
                    rows.append(p / p.sum(axis=1, keepdims=True))
        finally:
            self.model.train(was_training)
        return np.concatenate(rows) if rows else np.zeros((0, len(self.classes)))

    def predict(self, inputs, top=1) -> list:
        """One dict per input, in order: ``input`` (a file, a text, or the row of an array), ``class``
        and ``probability`` (the most probable), ``top`` (the ``top`` most probable, best first)."""
        top = min(as_count(top, "predict: top"), len(self.classes))
        names = self._names(inputs)
        probs = self.probabilities(inputs)
        out = []
        for name, p in zip(names, probs):
            order = np.argsort(-p, kind="stable")[:top]
            best = [{"class": self.classes[k], "probability": float(p[k])} for k in order]
            out.append({"input": name, **best[0], "top": best})
        return out

    # ------------------------------------------------------------------ inputs
    def _names(self, inputs):
        if isinstance(inputs, np.ndarray):
            return list(range(len(inputs)))
        if isinstance(inputs, (str, Path)) or (isinstance(inputs, tuple) and self.kind == "text"):
            inputs = [inputs]
        return [str(i) if isinstance(i, (str, Path)) else i if not isinstance(i, tuple) else " | ".join(i)
                for i in inputs]

    def _image_loader(self, inputs):
        if isinstance(inputs, (str, Path)):
            inputs = [inputs]
        if isinstance(inputs, (list, tuple)) and all(isinstance(i, (str, Path)) for i in inputs):
            missing = [str(i) for i in inputs if not Path(i).is_file()]
            if missing:
                raise PredictError(f"{self.source} is an image model, and {missing[0]!r} is not an image file: give "
                                   "it image files, or images as an array")
            images = (np.stack([read_image(p, self.size) for p in inputs]) if inputs
                      else np.zeros((0, 3, self.size, self.size), np.uint8))
        else:
            try:
                images = resize_images(as_images(inputs, "the images given"), self.size)
            except ValueError as err:
                raise PredictError(str(err)) from None
        steps = [Normalize(self.mean, self.std)]
        if self.image_size is not None and self.image_size not in (self.size, (self.size, self.size)):
            steps.append(Resize(self.image_size))
        dataset = ImageDataset(images, np.zeros(len(images), np.int64), self.classes, self.mean, self.std)
        device = next(iter(self.model.parameters())).device
        return DataLoader(dataset, self.batch_size, transform=Compose(steps), device=device)

    def _text_loader(self, inputs):
        if isinstance(inputs, (str, tuple)):
            inputs = [inputs]
        if isinstance(inputs, np.ndarray) or not all(isinstance(t, (str, tuple)) for t in inputs):
            raise PredictError(f"{self.source} is a text model; give it strings (or (text, pair) tuples)")
        for t in inputs:
            if self.paired is False and isinstance(t, tuple):
                raise PredictError(f"{self.source} is a model of single texts: {t!r} is a pair; give it one text")
            if self.paired and not (isinstance(t, tuple) and len(t) == 2):
                raise PredictError(f"{self.source} is a model of sentence pairs: {t!r} is one text; give it "
                                   "(text, pair) tuples")
        texts = [t if isinstance(t, str) else t[0] for t in inputs]
        pairs = [t[1] for t in inputs] if any(isinstance(t, tuple) for t in inputs) else None
        ids = self.tokenizer.encode_batch(texts, pairs, self.seq_len)[0] if texts else np.zeros((0, self.seq_len))
        dataset = TokenDataset(ids, np.zeros(len(texts), np.int64), self.classes, vocab_size=len(self.tokenizer))
        device = next(iter(self.model.parameters())).device
        return TokenLoader(dataset, self.batch_size, device=device)


def load(path, device="cpu", **overrides) -> Predictor:
    """``Predictor.from_checkpoint``: a run folder (its best.npz, else checkpoint.npz) or a checkpoint file."""
    return Predictor.from_checkpoint(path, device, **overrides)


def predict(path_or_predictor, inputs, top=1, device="cpu") -> list:
    """``load(path).predict(inputs, top)``: one dict per input (see ``Predictor.predict``)."""
    predictor = path_or_predictor if isinstance(path_or_predictor, Predictor) else load(path_or_predictor, device)
    return predictor.predict(inputs, top)


# ---------------------------------------------------------------------- the command line
def _image_files(inputs):
    """The image files of ``inputs`` (files, and folders read recursively in sorted order), in order."""
    files = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")
                           and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise PredictError(f"{path}: a folder without image files ({', '.join(IMAGE_SUFFIXES[:3])}, ...)")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise PredictError(f"{path}: no such file or folder")
    return files


def _text_lines(inputs, texts, paired=None):
    """(text or (text, pair), (file, line number) or None) of the --text strings, then of each file's
    non-empty lines. A tab separates a sentence pair's two texts for a pair model (``paired``), and
    is an ordinary character for a model of single texts; a checkpoint that does not say (None)
    reads a line with a tab as a pair."""
    from .data.textfile import numbered_lines

    def read(text, where):
        if paired is False or "\t" not in text:
            if paired:
                place = f"{where[0]}, line {where[1]}" if where else f"--text {text!r}"
                raise PredictError(f"{place}: a sentence-pair model needs a text and its pair, separated by a tab")
            return text
        return tuple(part.strip() for part in text.split("\t", 1))

    items = [(read(t, None), None) for t in texts]
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            raise PredictError(f"{path}: a folder; a text model reads files of one text a line, or --text")
        items += [(read(line, (path, n)), (path, n)) for n, line in numbered_lines(path)]
    return items


def _show(result, top, shorten):
    """'<input>: cat 91.2%, dog 8.8%': a long text cut to 60 characters (``shorten``), a file name whole."""
    shown = result["input"]
    if shorten and isinstance(shown, str) and len(shown) > 60:
        shown = shown[:57] + "..."
    picks = result["top"][:top]
    return f"{shown}: " + ", ".join(f"{r['class']} {100 * r['probability']:.1f}%" for r in picks)


def printable(text) -> str:
    """``text`` as it can be printed anywhere: a file name's undecodable bytes (which ``os.fsdecode``
    keeps as lone surrogates) as ``\\xNN``."""
    return str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _write(stream, text):
    """One line on ``stream``, whatever its encoding: what it cannot encode is written ``\\xNN``."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(printable(text).encode(encoding, "backslashreplace").decode(encoding) + "\n")


def _utf8(stream) -> bool:
    import codecs

    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name == "utf-8"
    except LookupError:
        return False


def main(argv=None) -> int:
    """``python -m tinymlp predict``: the exit status (0 ok, 2 a problem said in one line; 141 when the
    reader of the output went away, as ``| head`` does)."""
    p = argparse.ArgumentParser(
        prog="python -m tinymlp predict",
        description="Classify images or texts with a trained model: each input's class and probability.")
    p.add_argument("model", metavar="RUN_OR_CHECKPOINT",
                   help="a run's --out folder (its best.npz, else checkpoint.npz) or a checkpoint file")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="image files or folders (an image model); files of one text a line (a text model; a "
                        "sentence-pair model's lines hold the text, a tab, and its pair)")
    p.add_argument("--text", action="append", default=[], metavar="TEXT", help="a text to classify (repeatable)")
    p.add_argument("--top", type=int, default=1, metavar="K", help="the K most probable classes of each input")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list, one object per input in input order: input, class, probability, top")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs")
    args = p.parse_intermixed_args(argv)         # flags and inputs in any order
    try:
        if args.top < 1:
            raise PredictError(f"--top {args.top}: expected at least 1")
        predictor = load(args.model, args.device)
        if predictor.kind == "image":
            if args.text:
                raise PredictError(f"--text: {predictor.source} is an image model; give it image files or folders")
            inputs = _image_files(args.inputs)
            names = [printable(f) for f in inputs]
        else:
            items = _text_lines(args.inputs, args.text, predictor.paired)
            inputs, places = [text for text, _ in items], [where for _, where in items]
        if not inputs:
            raise PredictError("nothing to classify: give " + ("image files or folders" if predictor.kind == "image"
                                                                else "--text TEXT or files of one text a line"))
        results = predictor.predict(inputs, args.top)
    except (PredictError, CheckpointError, DatasetError, CudaUnavailableError) as err:
        _write(sys.stderr, f"error: {err}")
        return 2
    for i, result in enumerate(results):
        if predictor.kind == "image":
            result["input"] = names[i]
        elif places[i] is not None:
            result["file"], result["line"] = printable(places[i][0]), places[i][1]
    try:
        _write(sys.stderr, repr(predictor))
        if args.json:
            _write(sys.stdout, json.dumps(results, indent=1, ensure_ascii=not _utf8(sys.stdout)))
        else:
            for result in results:
                _write(sys.stdout, _show(result, args.top, shorten=predictor.kind == "text"))
        sys.stdout.flush()
    except BrokenPipeError:               # the reader is gone (| head): stop, as a process killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
