"""Grad mode: whether the operations applied now record a graph for ``backward()``.

    with tinymlp.no_grad():          # evaluation, an optimizer's update: no graph, no memory kept
        y = model(x)

    @tinymlp.no_grad                 # a decorator, with or without parentheses
    def evaluate(model, loader): ...

``no_grad`` turns recording off for a block or a function, ``enable_grad`` back on inside one.
The mode is per thread. A decorated generator function runs each of its steps in the mode (not
only the call that creates the generator), so ``@no_grad`` on a generator of batches means what
it says.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading

__all__ = ["enable_grad", "is_grad_enabled", "no_grad"]


class _GradMode(threading.local):
    enabled = True


_grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    """Whether new operations record a graph."""
    return _grad_mode.enabled


class _GradModeContext(contextlib.ContextDecorator):
    """Sets grad mode to ``enabled`` inside a ``with`` block or a decorated function."""

    enabled: bool

    def __new__(cls, func=None):
        self = super().__new__(cls)
        if func is None:
            return self
        if not callable(func):
            raise TypeError(f"{cls.__name__}() takes no arguments (or, as a decorator, the function), "
                            f"got {type(func).__name__}")
        return self(func)                   # @no_grad without parentheses: the decorated function

    def __enter__(self):
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _grad_mode.enabled = self._prev
        return False

    def _recreate_cm(self):  # a fresh instance per decorated call: recursion and threads are safe
        return type(self)()

    def __call__(self, func):
        if not inspect.isgeneratorfunction(func):
            return super().__call__(func)
        mode = self

        @functools.wraps(func)
        def generator(*args, **kwargs):        # every step of the generator in the mode
            with mode._recreate_cm():
                gen = func(*args, **kwargs)
                step = gen.send
                value = None
            while True:
                try:
                    with mode._recreate_cm():
                        item = step(value)
                except StopIteration as done:
                    return done.value
                step = gen.send
                try:
                    value = yield item
                except GeneratorExit:
                    with mode._recreate_cm():
                        gen.close()
                    raise
                except BaseException as exc:    # thrown into us: into the inner generator, in the mode
                    value, step = exc, gen.throw

        return generator


class no_grad(_GradModeContext):
    """Context manager and decorator in which operations build no graph at all."""

    enabled = False


class enable_grad(_GradModeContext):
    """Turn graph recording back on inside a ``no_grad`` region."""

    enabled = True
