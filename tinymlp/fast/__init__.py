"""The fast tier: drop-in implementations of the reference ops, on by default.

``tinymlp/ops/`` holds the reference tier: each op is the formula of its docstring, written
to be read. This package holds the same ops written to be fast: fused passes over memory in
cache-sized chunks, outputs written into buffers they already own, saved arrays freed on the
last backward, one matrix product whatever the memory layout of the input, flat optimizer
state, numba kernels on the CPU where numba is installed (``compiled.py``; ``TINYMLP_NUMBA=0``
leaves them out) and CuPy kernels on CUDA (``cuda.py``).

It is organised by op: ``fast/<topic>.py`` holds a topic's implementations for every back end
(``FastLayerNorm`` for NumPy, ``CompiledLayerNorm`` for numba, ``CudaLayerNorm`` for CUDA, each
a subclass of the reference Function with the same forward/backward contract) and
``fast/kernels/<topic>_numba.py``, ``<topic>_cuda.py`` the kernels they call.
``tests/test_fast_contract.py`` checks each against the reference (forward value and every
gradient, over hypothesis shapes and memory layouts). Where the back ends differ in a step or
two, the NumPy class names those steps as methods (``FastLayerNorm.normalize``,
``FastSpatialGating.split_gate``, ...), its forward and backward are classmethods that call them
through ``cls``, and the numba and CUDA subclasses override just those steps.

Dispatch happens in one place: the table below says which class runs each reference op on
each device, and importing this package registers it in ``tinymlp.dispatch``, where
``Function.apply`` (tinymlp/autograd.py) and the optimizers look it up. The engine itself has a
fast version too (``engine.py``: the same algorithm with fewer passes over memory), registered
beside the table for every device. Switching::

    TINYMLP_FAST=0 python train.py          # the whole run on the reference tier
    with tinymlp.fast.disabled():           # a block of code on the reference tier
        loss = model(x)
    with tinymlp.fast.reference_engine():   # the fast ops, the reference engine
    tinymlp.fast.set_enabled(False)         # from here on
    tinymlp.fast.is_enabled()

The switch is read when an op is *applied*: a graph built with the fast tier on runs the fast
backward passes even if the tier is switched off before ``backward()``.

On CUDA the whole training step can be captured into a CUDA graph and replayed (``capture.py``,
which ``fit`` uses): the CUDA ops' products go through cuBLAS calls a graph can hold
(``cublas.py``), and the values the host computes each step reach the kernels through device
memory (``scalars.py``).

Memory layout. The fast ops keep the memory order of their input: an output (and a gradient)
is laid out like the array it was computed from. The fast patch embedding lays the tokens of a
batch out token-major, (S, B, C) in memory behind a (B, S, C) array, so that every
token-mixing product (MLP-Mixer's token MLP on ``x.swapaxes(1, 2)``, the SGU's W N) is one
matrix product for the whole batch. The models never see this: their code and every shape they
print is (B, S, C).
"""

from __future__ import annotations

import contextlib

from .. import autograd, dispatch
from ..ops.activation import GELU
from ..ops.attention import Attention, SelfAttention, Softmax
from ..ops.dropout import Dropout
from ..ops.elementwise import Add
from ..ops.gating import SpatialGating, Toeplitz1d, Toeplitz2d
from ..ops.linear import Linear
from ..ops.loss import CrossEntropy
from ..ops.norm import LayerNorm
from ..ops.shape import GetItem, Patchify
from . import compiled, memory  # noqa: F401  (memory: malloc keeps freed memory, set at import)
from .activation import CompiledGELU, CudaGELU, FastGELU
from .attention import (CompiledAttention, CompiledSelfAttention, CompiledSoftmax, CudaAttention, CudaSelfAttention,
                        CudaSoftmax, FastAttention, FastSelfAttention, FastSoftmax)
from .dropout import CudaDropout
from .elementwise import CompiledAdd
from .engine import ENGINE
from .gating import CompiledSpatialGating, CudaSpatialGating, FastSpatialGating
from .linear import CudaLinear, FastLinear
from .loss import CudaCrossEntropy
from .norm import CompiledLayerNorm, CudaLayerNorm, FastLayerNorm
from .optim import CompiledFlatStep, CudaFlatStep, FlatStep, clip_grad_norm
from .shape import FastGetItem, FastPatchify
from .toeplitz import FastToeplitz1d, FastToeplitz2d

__all__ = ["TABLE", "disabled", "enabled", "implementation", "implementations", "is_enabled", "reference_engine",
           "register", "set_enabled"]

TABLE = [
    # reference                 NumPy (CPU)          numba (CPU)             CUDA
    (Linear,                    FastLinear,          None,                   CudaLinear),
    (Patchify,                  FastPatchify,        None,                   FastPatchify),
    (GetItem,                   FastGetItem,         None,                   FastGetItem),
    (GELU,                      FastGELU,            CompiledGELU,           CudaGELU),
    (Add,                       None,                CompiledAdd,            None),
    (LayerNorm,                 FastLayerNorm,       CompiledLayerNorm,      CudaLayerNorm),
    (Softmax,                   FastSoftmax,         CompiledSoftmax,        CudaSoftmax),
    (Attention,                 FastAttention,       CompiledAttention,      CudaAttention),
    (SelfAttention,             FastSelfAttention,   CompiledSelfAttention,  CudaSelfAttention),
    (SpatialGating,             FastSpatialGating,   CompiledSpatialGating,  CudaSpatialGating),
    (Dropout,                   None,                None,                   CudaDropout),
    (CrossEntropy,              None,                None,                   CudaCrossEntropy),
    (Toeplitz1d,                FastToeplitz1d,      None,                   None),
    (Toeplitz2d,                FastToeplitz2d,      None,                   None),
    (dispatch.OPTIMIZER_STEP,   FlatStep.step,       CompiledFlatStep.step,  CudaFlatStep.step),
    (dispatch.CLIP_GRAD_NORM,   None,                None,                   clip_grad_norm),
]
"""What runs instead of each reference, per back end (None: the reference itself). The numba
column replaces the NumPy one on the CPU where numba is installed; a numba class runs its NumPy
parent's code where its kernels do not apply, and while ``compiled.set_enabled(False)``."""


def _fill():
    dispatch.register(dispatch.ENGINE, "any", ENGINE)
    for reference, numpy_impl, numba_impl, cuda_impl in TABLE:
        cpu = numba_impl if numba_impl is not None and compiled.available() else numpy_impl
        for device, impl in (("cpu", cpu), ("cuda", cuda_impl)):
            if impl is not None:
                dispatch.register(reference, device, impl)


def register(reference, devices=("cpu", "cuda")):
    """Class decorator: make ``impl`` the fast implementation of the Function ``reference`` on
    ``devices`` (it must subclass ``reference``)."""
    if isinstance(devices, str):
        devices = (devices,)

    def decorate(impl):
        if not issubclass(impl, reference):
            raise TypeError(f"{impl.__name__} must subclass {reference.__name__}, the Function it stands in for")
        for device in devices:
            dispatch.register(reference, device, impl)
        return impl

    return decorate


def implementations():
    """``{(reference, device): fast implementation}``: what the fast tier replaces."""
    return dispatch.registered()


def implementation(reference, device="cpu"):
    """The class that ``reference.apply`` runs on ``device`` right now: its fast implementation
    while the tier is on and one is registered, else ``reference`` itself."""
    return dispatch.implementation(reference, device)


def is_enabled() -> bool:
    """Whether ops run their fast implementations (``TINYMLP_FAST=0`` makes it False at import)."""
    return dispatch.is_enabled()


def set_enabled(on: bool) -> None:
    """Turn the fast tier on or off for the rest of the process (the switch lives in ``tinymlp.dispatch``)."""
    dispatch.set_enabled(on)


@contextlib.contextmanager
def _switched(on):
    previous = dispatch.is_enabled()
    dispatch.set_enabled(on)
    try:
        yield
    finally:
        dispatch.set_enabled(previous)


def disabled():
    """Context manager: the ops applied inside run the reference tier."""
    return _switched(False)


def enabled():
    """Context manager: the ops applied inside run the fast tier (where one is registered)."""
    return _switched(True)


@contextlib.contextmanager
def reference_engine():
    """Context manager: the fast ops under the reference engine (tinymlp/autograd.py), to tell
    a wrong result of the fast engine's savings from one of the fast ops."""
    dispatch.register(dispatch.ENGINE, "any", autograd.REFERENCE)
    try:
        yield
    finally:
        dispatch.register(dispatch.ENGINE, "any", ENGINE)


_fill()
