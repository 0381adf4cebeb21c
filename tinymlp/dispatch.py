"""The dispatch table: where a reference operation finds its fast implementation, and the switch.

tinymlp has two tiers. The reference tier (``tinymlp/ops/``, ``tinymlp/optim.py``) is the
formula, written to be read; the fast tier (``tinymlp/fast/``) is the same arithmetic arranged
for speed. The reference never imports the fast tier. Instead the fast tier, when it is
imported, fills this table, and the reference looks its operation up here at the moment it
runs:

    (reference, device)  ->  implementation              device: "cpu", "cuda" (or "any")

- a reference ``Function`` class (``LayerNorm``) maps to a subclass with the same
  forward/backward contract; ``Function.apply`` (tinymlp/autograd.py) runs it instead of the
  reference: the engine's one hook;
- ``OPTIMIZER_STEP`` maps to ``fn(optimizer)``, ``optimizer.step()`` over all parameters at
  once (``Optimizer.step`` in tinymlp/optim.py looks it up);
- ``CLIP_GRAD_NORM`` maps to ``fn(grads, max_norm, sync)``, which returns the norm as
  ``optim.clip_grad_norm`` does, or None where it does not apply (the caller's code then runs);
- ``ENGINE`` maps, for ``"any"`` device, to an ``autograd.Engine`` (a subclass that overrides
  some of its steps): ``Function.apply`` and ``backward()`` run it instead of the reference engine.

The switch: ``set_enabled(False)`` (or ``TINYMLP_FAST=0`` in the environment, read at import)
makes every lookup answer "none", so the whole library runs the reference tier.
``tinymlp.fast`` offers the same switch as ``fast.disabled()``, ``fast.set_enabled(...)``.
"""

from __future__ import annotations

import os
import sys

__all__ = ["CLIP_GRAD_NORM", "ENGINE", "OPTIMIZER_STEP", "implementation", "implementation_for", "is_enabled", "lookup",
           "register", "registered", "set_enabled"]

OPTIMIZER_STEP = "optimizer step"
CLIP_GRAD_NORM = "clip_grad_norm"
ENGINE = "autograd engine"

_table = {}
_enabled = os.environ.get("TINYMLP_FAST", "1").strip().lower() not in ("0", "false", "no", "off")


def register(reference, device, implementation) -> None:
    """Make ``implementation`` the fast version of ``reference`` on ``device``. A class learns its
    reference as ``implementation.reference`` (error messages and plots name the reference)."""
    if device not in ("cpu", "cuda", "any"):
        raise ValueError(f"register: device must be 'cpu', 'cuda' or 'any', got {device!r}")
    _table[(reference, device)] = implementation
    if isinstance(implementation, type):
        implementation.reference = reference


def lookup(reference, device):
    """The registered implementation of ``reference`` on ``device``, or None (none registered,
    or the switch is off)."""
    return _table.get((reference, device)) if _enabled else None


def implementation(reference, device="cpu"):
    """What runs for ``reference`` on ``device`` right now: its fast implementation, else itself."""
    found = lookup(reference, device)
    return reference if found is None else found


def implementation_for(reference, arrays):
    """``implementation(reference, device)`` for the device of ``arrays`` (CUDA if any of them
    is a CuPy array): the lookup ``Function.apply`` makes for every op."""
    if not _enabled or not _table:
        return reference
    on_gpu = "cupy" in sys.modules and any(type(a).__module__.startswith("cupy") for a in arrays)
    return _table.get((reference, "cuda" if on_gpu else "cpu"), reference)


def registered() -> dict:
    """A copy of the table: ``{(reference, device): implementation}``."""
    return dict(_table)


def is_enabled() -> bool:
    """Whether lookups find the fast implementations (``TINYMLP_FAST=0`` makes it False at import)."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turn the fast tier on or off for the rest of the process."""
    global _enabled
    _enabled = bool(on)
