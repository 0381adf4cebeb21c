"""The fast tier: drop-in implementations of the reference ops, on by default.

``tinymlp/ops/`` holds the reference tier: each op is the formula of its docstring, written
to be read. This package holds the same ops written to be fast: fused passes over memory in
cache-sized chunks, outputs written into buffers they already own, saved arrays freed on the
last backward, one matrix product whatever the memory layout of the input, flat optimizer
state, CuPy kernels on CUDA, and numba kernels on the CPU where numba is installed
(``compiled.py``; ``TINYMLP_NUMBA=0`` leaves them out). Each implementation is a subclass of its reference Function
with the same forward/backward contract, registered with ``register`` for a device, and
``tests/test_fast_contract.py`` checks it against the reference (forward value and every
gradient, over hypothesis shapes and memory layouts).

``Function.apply`` (tinymlp/autograd.py) looks the registered implementation up in the dispatch
table (tinymlp/dispatch.py); that is the engine's one hook. Switching::

    TINYMLP_FAST=0 python train.py          # the whole run on the reference tier
    with tinymlp.fast.disabled():           # a block of code on the reference tier
        loss = model(x)
    tinymlp.fast.set_enabled(False)         # from here on
    tinymlp.fast.is_enabled()

The switch is read when an op is *applied*: a graph built with the fast tier on runs the fast
backward passes even if the tier is switched off before ``backward()``.

Memory layout. The fast ops keep the memory order of their input: an output (and a gradient)
is laid out like the array it was computed from. The fast patch embedding lays the tokens of a
batch out token-major, (S, B, C) in memory behind a (B, S, C) array, so that every
token-mixing product (MLP-Mixer's token MLP on ``x.swapaxes(1, 2)``, the SGU's W N) is one
matrix product for the whole batch. The models never see this: their code and every shape they
print is (B, S, C).
"""

from __future__ import annotations

import contextlib

from .. import dispatch

__all__ = ["disabled", "enabled", "implementation", "implementations", "is_enabled", "register", "set_enabled"]


def register(reference, devices=("cpu", "cuda")):
    """Class decorator: make ``impl`` the fast implementation of ``reference`` on ``devices``."""
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
    """``{(reference Function, device): fast implementation}``: what the fast tier replaces."""
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


from . import activation, attention, gating, linear, norm, optim, shape  # noqa: E402,F401  (they register)
from . import compiled, memory  # noqa: E402,F401  (numba kernels where installed; malloc keeps memory)
