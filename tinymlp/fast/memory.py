"""Memory that stays in the process: glibc's malloc told not to hand big blocks back to the OS.

A training step allocates and frees the same large arrays every time (activations, their
gradients: 4 to 32 MiB each for the CIFAR models). glibc serves blocks above a threshold (128
KiB at first, adapting up to 32 MiB) with a fresh ``mmap`` and returns them to the OS on
``free``; the next step maps them again, and the OS zero-fills every page on first touch: a
page fault per 4 KiB, 50 to 140 MiB of them per step when nothing else keeps the heap warm
(measured on the CIFAR models). PyTorch avoids this with its own caching allocator; NumPy relies on
malloc. So at import of the fast tier, on glibc (Linux), tinymlp calls::

    mallopt(M_MMAP_MAX, 0)                 # big blocks come from the heap, not from mmap
    mallopt(M_TRIM_THRESHOLD, 1 << 30)     # and a freed heap top is kept (up to 1 GiB)

so freed blocks are reused by the next step without page faults. The cost: the process keeps
its peak memory until it exits (as PyTorch's allocator does). ``TINYMLP_KEEP_MEMORY=0`` in the
environment (read at import) leaves malloc as it is; so does ``TINYMLP_FAST=0``. The setting
belongs to the process, not to an op: the maths of every op is the same either way.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["describe", "keep_memory"]

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD = 1 << 30

_state = {"applied": False, "why": ""}


def _off(name, default="1"):
    return os.environ.get(name, default).strip().lower() in ("0", "false", "no", "off")


def keep_memory():
    """Apply the two ``mallopt`` calls above (glibc only); True if they were applied."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _state["why"] = "not glibc: malloc left as it is"
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError) as exc:
        _state["why"] = f"mallopt unavailable ({exc})"
        return False
    _state["applied"] = ok
    _state["why"] = (("glibc mallopt: no mmap for big blocks, freed memory kept "
                      "(TINYMLP_KEEP_MEMORY=0 to leave malloc alone)")
                     if ok else "mallopt refused the settings")
    return ok


def describe():
    """One line: the malloc setting of this process."""
    return _state["why"] or "malloc left as it is"


if _off("TINYMLP_KEEP_MEMORY"):
    _state["why"] = "TINYMLP_KEEP_MEMORY=0: glibc defaults (freed big blocks go back to the OS)"
elif _off("TINYMLP_FAST"):
    _state["why"] = "TINYMLP_FAST=0: glibc defaults"
else:
    keep_memory()
