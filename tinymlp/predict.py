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
import sys
from pathlib import Path

import numpy as np

from . import checkpoint, models
from .grad_mode import no_grad
from .backend import CudaUnavailableError, to_device
from .checkpoint import CheckpointError
from .data import DatasetError, Tokenizer
from .data.folder import IMAGE_SUFFIXES, as_images, read_image, resize_images
from .data.loader import DataLoader, ImageDataset, as_count
from .data.text_loader import TokenDataset, TokenLoader
from .data.transforms import Compose, Normalize, Resize
from .nn import Module

__all__ = ["CHECKPOINT_NAMES", "PredictError", "Predictor", "architecture", "checkpoint_path", "load", "load_model",
           "main", "model_class", "predict"]

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
    try:
        model = cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: its model_config does not make a {cls.__name__} ({err})") from None
    checkpoint.load(path, model)
    return model.to(device).eval(), meta


# ---------------------------------------------------------------------- the predictor
class Predictor:
    """A trained classifier with the preprocessing its run used (see the module docstring).

    ``Predictor.from_checkpoint(path)`` (or ``load(path)``) reads everything from a checkpoint; the
    keywords ``mean``, ``std``, ``size`` and ``image_size`` override its ``preprocess`` record
    (a checkpoint written before it was kept needs them)."""

    def __init__(self, model, classes, *, tokenizer=None, seq_len=None, mean=None, std=None, size=None,
                 image_size=None, source="the model", batch_size=256):
        self.model, self.classes, self.source = model, [str(c) for c in classes], source
        self.tokenizer, self.seq_len = tokenizer, seq_len
        self.kind = "text" if tokenizer is not None else "image"
        self.mean, self.std, self.size, self.image_size = mean, std, size, image_size
        self.batch_size = as_count(batch_size, "Predictor: batch_size")
        if self.kind == "image" and (mean is None or std is None or size is None):
            raise PredictError(f"{source} does not record the preprocessing of its images (mean, std, size), "
                               "which a checkpoint of the example scripts keeps in meta['preprocess']: pass "
                               "mean=, std= and size= to Predictor")

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
        if not classes:
            raise PredictError(f"{path}: the checkpoint names no classes, so its outputs cannot be named")
        model, meta = load_model(path, device)
        pre = meta.get("preprocess") if isinstance(meta.get("preprocess"), dict) else {}
        if "tokenizer" in meta:
            try:
                tokenizer = Tokenizer.from_dict(meta["tokenizer"], source=f"{path}: its stored tokenizer")
            except ValueError as err:
                raise CheckpointError(str(err)) from None
            seq_len = int(pre.get("seq_len", config.get("seq_len")))
            return cls(model, classes, tokenizer=tokenizer, seq_len=seq_len, source=str(path), **overrides)
        size = pre.get("image_size", config.get("image_size"))
        settings = dict(mean=pre.get("mean"), std=pre.get("std"), size=pre.get("size"),
                        image_size=size if isinstance(size, int) else tuple(size) if size else None)
        return cls(model, classes, source=str(path), **{**settings, **overrides})

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


def _text_lines(inputs, texts):
    """(texts, where each came from): the --text strings, then each file's non-empty lines (a
    tab-separated line is a sentence pair)."""
    from .data.textfile import numbered_lines

    items = [(t, None) for t in texts]
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            raise PredictError(f"{path}: a folder; a text model reads files of one text a line, or --text")
        for n, line in numbered_lines(path):
            items.append((tuple(line.split("\t", 1)) if "\t" in line else line, f"{path}:{n}"))
    return items


def _show(result, top):
    shown = result["input"]
    if isinstance(shown, str) and len(shown) > 60:
        shown = shown[:57] + "..."
    picks = result["top"][:top]
    return f"{shown}: " + ", ".join(f"{r['class']} {100 * r['probability']:.1f}%" for r in picks)


def main(argv=None) -> int:
    """``python -m tinymlp predict``: the exit status (0 ok, 2 a problem said in one line)."""
    p = argparse.ArgumentParser(
        prog="python -m tinymlp predict",
        description="Classify images or texts with a trained model: each input's class and probability.")
    p.add_argument("model", metavar="RUN_OR_CHECKPOINT",
                   help="a run's --out folder (its best.npz, else checkpoint.npz) or a checkpoint file")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="image files or folders (an image model); files of one text a line (a text model)")
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
            files = _image_files(args.inputs)
            inputs, names = files, [str(f) for f in files]
        else:
            items = _text_lines(args.inputs, args.text)
            inputs, names = [text for text, _ in items], [where for _, where in items]
        if not inputs:
            raise PredictError("nothing to classify: give " + ("image files or folders" if predictor.kind == "image"
                                                                else "--text TEXT or files of one text a line"))
        results = predictor.predict(inputs, args.top)
    except (PredictError, CheckpointError, DatasetError, CudaUnavailableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{predictor!r}", file=sys.stderr)
    if predictor.kind == "text":
        for result, where in zip(results, names):
            if where is not None:
                result["file"], result["line"] = where.rsplit(":", 1)[0], int(where.rsplit(":", 1)[1])
    if args.json:
        print(json.dumps(results, indent=1, ensure_ascii=False))
    else:
        for result in results:
            print(_show(result, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
