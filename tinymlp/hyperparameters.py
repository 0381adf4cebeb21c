"""The checks every optimizer, schedule and clipping argument goes through, with the messages
that name the owner, the argument, the value and the range expected."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_hyperparameter", "describe", "is_count"]


def check_hyperparameter(owner, name, value, low=0.0, high=None, low_open=False, high_open=False):
    """``value`` as a float, if it is a finite number in [low, high] (an end excluded when
    ``low_open``/``high_open``); else a ValueError naming ``owner``, the argument, the value and
    the range. The one check every optimizer, schedule and ``clip_grad_norm`` argument goes through."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: {name} must be a number, got {value!r}") from None
    finite = math.isfinite(number)
    too_low = low is not None and (number < low or (low_open and number == low))
    too_high = high is not None and (number > high or (high_open and number == high))
    if finite and not too_low and not too_high:     # (checked every step: the message is built only when needed)
        return number
    left = f"{low:g} {'<' if low_open else '<='} " if low is not None else ""
    right = f" {'<' if high_open else '<='} {high:g}" if high is not None else ""
    expected = f"expected {left}{name}{right}"
    if not finite:
        raise ValueError(f"{owner}: {name}={value!r} is not a finite number; {expected}")
    raise ValueError(f"{owner}: {name}={value!r} is out of range; {expected}")


def is_count(value) -> bool:
    """An integer >= 0 (a step count, an index), not a bool or a float."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0


def describe(value) -> str:
    """``value`` as an error message shows it: its type and the start of its repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
