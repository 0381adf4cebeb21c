"""Weight files without pickle: ``.safetensors`` and ``.npz`` read and written as NumPy arrays.

    arrays, meta = read_weights("mixer_b16_224.safetensors")   # name -> array, header metadata
    save_safetensors("mine.safetensors", {"w": w})

tinymlp reads ``.safetensors`` (through the optional ``safetensors`` package: the checkout's
``interop`` extra) and ``.npz`` (``allow_pickle=False``), never a pickled ``.pth``/``.bin``:
unpickling runs whatever code the file names. Such a file raises ``PickleRefusedError`` with
the one-line command (``conversion_command``) that converts it once, on a machine where you
trust it. The format is told by the file's first bytes, not its name. bfloat16 tensors
(common on the hub; NumPy has none) are read as the exact float32 values. A truncated or
damaged file raises one ``InteropError`` naming it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from ..files import atomic_write, npz_problem

__all__ = [
    "InteropError", "PickleRefusedError", "as_numpy", "conversion_command", "load_safetensors", "load_source",
    "read_weights", "safetensors_header", "safetensors_modules", "save_safetensors", "sniff_format",
]

SAFETENSORS_HINT = 'pip install safetensors (or pip install -e ".[interop]" from your tinymlp checkout)'
PICKLED_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle", ".tar")


class InteropError(ValueError):
    """Weights that tinymlp cannot map onto one of its models, with what was found and expected."""


class PickleRefusedError(InteropError):
    """A pickled PyTorch file: tinymlp never unpickles (it could run any code)."""


# ---------------------------------------------------------------------- reading
def conversion_command(path) -> str:
    """The one-line command that turns a pickled PyTorch state dict into a .safetensors file."""
    src = os.fspath(path)
    dst = str(Path(src).with_suffix(".safetensors"))
    return (f"python -c \"import torch; from safetensors.torch import save_file; "
            f"sd = torch.load('{src}', map_location='cpu', weights_only=True); "
            f"sd = sd.get('state_dict', sd.get('model', sd)); "
            f"save_file({{k: v.contiguous() for k, v in sd.items()}}, '{dst}')\"")


def _refuse_pickle(path):
    raise PickleRefusedError(
        f"{path} is a pickled PyTorch file, and tinymlp never unpickles (loading a pickle runs "
        f"whatever code it names). Convert it once, on a machine where you trust the file "
        f"(needs torch and safetensors):\n  {conversion_command(path)}\n"
        f"then load the .safetensors file. (timm models from the Hugging Face hub are usually "
        f"published as model.safetensors already.)"
    )


def sniff_format(path) -> str:
    """'safetensors', 'npz', 'pickle' or 'unknown', from the first bytes of the file."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:1] == b"\x80":                       # pickle protocol 2+ opcode
        return "pickle"
    if head[:4] == b"PK\x03\x04":                 # a zip: NumPy's .npz, or torch.save's zip of pickles
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise InteropError(f"{path} is a damaged or truncated zip/.npz file (an incomplete download?): "
                               f"{_first_line(err)}") from None
        if any(n.endswith(".pkl") for n in names):
            return "pickle"
        return "npz"
    if len(head) == 9 and head[8:9] == b"{":      # 8-byte header length, then the JSON header
        return "safetensors"
    return "unknown"


def read_weights(path) -> tuple[dict, dict]:
    """(name -> NumPy array, metadata) from a ``.safetensors`` or ``.npz`` file, without pickle.

    A pickled ``.pth``/``.bin`` (or a ``torch.save`` zip under any name) raises
    ``PickleRefusedError`` with the one-line conversion to safetensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such weights file: {path}")
    kind = sniff_format(path)
    if kind == "pickle" or (kind == "unknown" and path.suffix.lower() in PICKLED_SUFFIXES):
        _refuse_pickle(path)
    if kind == "npz":
        problem = npz_problem(path)        # object arrays, shapes larger than the file: named, not loaded
        if problem is not None:
            raise InteropError(f"{path}: {problem}")
        try:
            with np.load(path, allow_pickle=False) as npz:
                if "__header__" in npz.files:
                    raise InteropError(
                        f"{path} is a tinymlp training checkpoint (checkpoint.save), not a weights file: "
                        f"build its model with tinymlp.predict.load_model({os.fspath(path)!r}) "
                        "(examples/finetune.py --pretrained takes it as it is)")
                arrays = {k: npz[k] for k in npz.files}
        except InteropError:
            raise
        except MemoryError:
            raise InteropError(f"{path}: an array in it is larger than the memory here") from None
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as err:
            raise InteropError(f"{path} is damaged or truncated (an incomplete download?): {_first_line(err)}") \
                from None
        meta = {}
        if "__tinymlp_meta__" in arrays:     # written by save_timm
            try:
                meta = json.loads(arrays.pop("__tinymlp_meta__").tobytes().decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                meta = None
            if not isinstance(meta, dict):
                raise InteropError(f"{path}: its __tinymlp_meta__ entry is damaged (not a JSON object)")
        return arrays, meta
    if kind == "safetensors":
        return load_safetensors(path, with_metadata=True)
    raise InteropError(f"{path}: not a .safetensors or .npz file (tinymlp reads only those two formats)")


def safetensors_modules():
    try:
        import safetensors.numpy as stn
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"reading and writing .safetensors needs the safetensors package: {SAFETENSORS_HINT}") \
            from None
    return stn, safe_open


# ---------------------------------------------------------------------- writing
def save_safetensors(path, tensors: dict, metadata: dict | None = None, *, what="save_safetensors") -> None:
    """Write name -> array (NumPy, or anything ``np.asarray`` takes) as a .safetensors file.

    ``metadata`` (str -> str) goes into the file's header; PyTorch loaders expect
    ``{"format": "pt"}``, which is added when missing.
    """
    stn, _ = safetensors_modules()
    arrays = {k: np.ascontiguousarray(as_numpy(v)) for k, v in tensors.items()}
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    blob = stn.save(arrays, metadata=meta)
    atomic_write(path, lambda f: f.write(blob), what=what)


# ---------------------------------------------------------------------- .safetensors: header checked, bfloat16 in NumPy
def load_safetensors(path, with_metadata: bool = False):
    """name -> NumPy array from a .safetensors file (and its header metadata when asked).

    bfloat16 tensors (common for weights on the hub; NumPy has no bfloat16) are converted to
    float32 exactly, with a note on stderr saying so. A truncated or damaged file raises one
    ``InteropError`` naming it.
    """
    stn, safe_open = safetensors_modules()
    header = safetensors_header(path)
    bf16 = sorted(k for k, v in header.items()
                  if k != "__metadata__" and isinstance(v, dict) and v.get("dtype") == "BF16")
    try:
        if bf16:
            arrays = _read_safetensors_bf16(path, header)
        else:
            arrays = stn.load_file(str(path))
    except InteropError:
        raise
    except Exception as err:   # SafetensorError and friends: one sentence, not the Rust message alone
        raise InteropError(f"{path} is damaged or truncated (an incomplete download?): {_first_line(err)}") from None
    if bf16:
        print(f"note: {path}: {len(bf16)} bfloat16 tensor{'s' * (len(bf16) != 1)} converted to float32 "
              "(NumPy has no bfloat16; the values are exact)", file=sys.stderr)
    if not with_metadata:
        return arrays
    meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    meta = {str(k): str(v) for k, v in meta.items()}
    if "tinymlp" in meta:
        try:
            extra = json.loads(meta["tinymlp"])
        except ValueError:
            extra = None
        if isinstance(extra, dict):
            meta.update(extra)
    return arrays, meta


def _first_line(err):
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                      "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def safetensors_header(path):
    """The JSON header of a .safetensors file (8-byte little-endian length, then JSON), checked
    against the file's size; an InteropError naming the file when it is truncated or damaged."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InteropError(f"{path} is truncated ({size} bytes, less than a .safetensors header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise InteropError(f"{path} is truncated or damaged: its header claims {n:,} bytes, the file has "
                               f"{size - 8:,} after the length (an incomplete download?)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InteropError(f"{path}: its .safetensors header is not valid JSON (a damaged file?)") from None
    if not isinstance(header, dict):
        raise InteropError(f"{path}: its .safetensors header is not a JSON object (a damaged file?)")
    data = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise InteropError(f"{path}: tensor {name!r} has a damaged entry in the .safetensors header")
        if offsets[1] > data:
            raise InteropError(f"{path} is truncated: tensor {name!r} ends at byte {offsets[1]:,} of the data, "
                               f"which has {data:,} bytes (an incomplete download?)")
    return header


def _read_safetensors_bf16(path, header):
    """Read a .safetensors file with bfloat16 tensors in NumPy alone, bfloat16 becoming float32
    (its 16 bits are the top half of a float32: shifted left by 16, the value is exact)."""
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        f.seek(start)
        blob = f.read()
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (lo, hi) = entry.get("dtype"), entry.get("shape"), entry["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InteropError(f"{path}: tensor {name!r} has a damaged shape {shape!r} in the header")
        count = math.prod(shape)
        if dtype == "BF16":
            if hi - lo != 2 * count:
                raise InteropError(f"{path}: tensor {name!r} has {hi - lo} bytes for {count} bfloat16 values")
            bits = np.frombuffer(blob, dtype="<u2", count=count, offset=lo).astype(np.uint32) << 16
            arrays[name] = bits.view(np.float32).reshape(shape)
        elif dtype in SAFETENSORS_DTYPES:
            np_dtype = np.dtype(SAFETENSORS_DTYPES[dtype])
            if hi - lo != np_dtype.itemsize * count:
                raise InteropError(f"{path}: tensor {name!r} has {hi - lo} bytes for {count} {dtype} values")
            arrays[name] = np.frombuffer(blob, dtype=np_dtype, count=count, offset=lo).reshape(shape).copy()
        else:
            raise InteropError(f"{path}: tensor {name!r} has dtype {dtype!r}, which tinymlp cannot read")
    return arrays


# ---------------------------------------------------------------------- arrays from anywhere
def as_numpy(value) -> np.ndarray:
    """An array from NumPy, CuPy, a tinymlp Tensor or a torch tensor (bfloat16 becomes float32)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):       # a torch tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    data = getattr(value, "data", None)
    if data is not None and not isinstance(value, np.ndarray) and hasattr(data, "shape"):
        value = data                                           # a tinymlp Tensor
    if hasattr(value, "get") and not isinstance(value, (np.ndarray, dict)):
        value = value.get()                                    # CuPy -> NumPy
    return np.asarray(value)


def load_source(source) -> tuple[dict, dict, str]:
    """(arrays, metadata, description) from a path or a mapping of names to arrays."""
    if isinstance(source, (str, os.PathLike)):
        arrays, meta = read_weights(source)
        return arrays, meta, os.fspath(source)
    if not hasattr(source, "items"):
        raise TypeError(f"expected a path or a mapping of names to arrays, got {type(source).__name__}")
    return {str(k): as_numpy(v) for k, v in source.items()}, {}, "the state dict"
