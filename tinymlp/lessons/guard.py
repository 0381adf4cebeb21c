"""Running an answer with the code that would do the exercise for it made unavailable.

An exercise asks for a piece the library already has: LayerNorm's backward is in
``tinymlp/ops/norm.py``, ``tinymlp.gradcheck`` computes any gradient numerically, and the
autograd engine differentiates any composition of ops. An answer that calls one of them has
not done the exercise. ``Guard`` runs the answer so that such a call fails, with a sentence
that says what was called and why it is not allowed:

* the library code that implements the exercise (``Exercise.forbidden``: the reference
  Function, its fast-tier versions, the helpers behind them);
* numerical differentiation (every function of ``tinymlp.gradcheck``, ``tinymlp.testing``)
  and the checks' own references (``tinymlp/lessons/exercises.py``);
* the autograd engine (``Tensor.backward``) anywhere in an answer;
* in a Function's backward: any tinymlp op (``Function.apply``: backward works on arrays and
  builds no graph) and the answer's own forward (re-running forward at nearby points is a
  finite difference, not a derivation);
* in an ``apply`` the answer defines in place of the engine's: any tinymlp op but the answer's
  own (a replaced ``apply`` that calls ``LayerNorm.apply``, or composes ops for the engine to
  differentiate, has not written the exercise's forward and backward).

How: the answer is wrapped (a Function or Module subclass, a function) so that the guard
knows when the answer's code is running, and a trace function (``sys.settrace``, called on
every Python call) refuses the forbidden code objects there. The check's own code, which
calls the same library (gradcheck, the engine), runs outside the answer and is not affected.
A refused call is recorded as well as raised, so an answer that catches the exception still
fails.

``Snapshot`` is the other half, for the grader: the state of tinymlp's and NumPy's modules
before an answer's code runs, compared after it, so that an answer that patches the checker
(``EXERCISES['04.1'].run = ...``, ``np.allclose = ...``) fails instead of passing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import types

__all__ = ["Forbidden", "Guard", "Snapshot"]


class Forbidden(Exception):
    """Raised inside an answer that calls code the exercise does not allow."""


def _codes_of(obj):
    """The code objects of a function, or of every function a class defines (not inherits)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return [c for f in (obj.fget, obj.fset, obj.fdel) if f for c in _codes_of(f)]
    if isinstance(obj, functools.partial):
        return _codes_of(obj.func)
    code = getattr(obj, "__code__", None)
    if code is not None:
        return [code]
    if isinstance(obj, type):
        return [c for value in vars(obj).values() for c in _codes_of(value)]
    return []


def _subclasses(cls):
    """A class and its subclasses defined inside tinymlp (the fast tier registers subclasses)."""
    out, stack = [], [cls]
    while stack:
        c = stack.pop()
        if c.__module__.startswith("tinymlp.") or c is cls:
            out.append(c)
            stack.extend(c.__subclasses__())
    return out


def resolve(dotted):
    """The object a dotted name refers to: ``tinymlp.ops.norm.LayerNorm``."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"cannot resolve {dotted!r}")


def _module_functions(module, *, classes=True):
    """Code objects of the functions (and, if ``classes``, the methods) defined in a module."""
    codes = []
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, types.FunctionType) or (classes and isinstance(value, type)):
            codes += _codes_of(value)
    return codes


@functools.lru_cache(maxsize=None)
def _always_forbidden():
    """{code: reason} for code no answer may call: numerical gradients and the checks' references."""
    from .. import gradcheck as _  # noqa: F401 (make sure the modules are loaded)
    from .. import testing
    from . import exercises

    reasons = {}
    numeric = [sys.modules["tinymlp.gradcheck"], testing]
    numeric += [m for name, m in list(sys.modules.items()) if name.startswith("tinymlp.gradcheck.")]
    for module in numeric:
        for code in _module_functions(module):
            reasons[code] = (f"the answer calls {module.__name__}'s {code.co_qualname} (numerical "
                             "differentiation): derive the gradient by hand instead of estimating it")
    for code in _module_functions(exercises, classes=False):
        reasons[code] = (f"the answer calls {code.co_qualname} from tinymlp/lessons/exercises.py, the checker's "
                         "own reference: write the computation yourself")
    return reasons


@functools.lru_cache(maxsize=None)
def _engine():
    """{code: reason} for the autograd engine (in any answer) and {code: reason} for backward."""
    from .. import autograd
    from ..tensor import Tensor

    anywhere = {}
    for code in _codes_of(autograd.backward) + _codes_of(Tensor.backward):
        anywhere[code] = ("the answer runs tinymlp's autograd engine (Tensor.backward) to get a gradient: derive "
                          "the gradient by hand and compute it with NumPy")
    in_backward = {}
    for code in _codes_of(autograd.Function.apply):
        in_backward[code] = ("backward calls a tinymlp op (Function.apply: F.*, Tensor arithmetic): backward "
                             "works on the raw arrays forward saved, with NumPy (xp), and builds no graph")
    return anywhere, in_backward


@functools.lru_cache(maxsize=None)
def _engine_apply():
    """The code of the engine's ``Function.apply`` (every tinymlp op runs through it)."""
    from ..autograd import Function

    return Function.apply.__func__.__code__


class Guard:
    """Run an exercise's answer with the forbidden code refusing to run inside it.

    ``with Guard(exercise) as guard: exercise.run(guard.wrap(answer), case)``; afterwards
    ``guard.violations`` lists every refused call (one sentence each).
    """

    def __init__(self, ex):
        self.ex = ex
        self.codes = dict(_always_forbidden())
        anywhere, self.backward_codes = _engine()
        self.backward_codes = dict(self.backward_codes)
        self.codes.update(anywhere)
        self.references = {}  # reference Function classes -> the sentence (for an .apply refused in backward)
        for dotted in ex.forbidden:
            obj = resolve(dotted)
            where = _where(obj)
            for item in _subclasses(obj) if isinstance(obj, type) else [obj]:
                module = getattr(item, "__module__", None) or dotted.rsplit(".", 1)[0]
                if isinstance(item, type):
                    self.references[item] = (f"the answer calls {module}.{item.__qualname__} ({where}), the library's "
                                             f"own implementation of what exercise {ex.id} asks for: write it yourself")
                for code in _codes_of(item):
                    self.codes.setdefault(code, f"the answer calls {module}.{code.co_qualname} ({where}), the library's "
                                        f"own implementation of what exercise {ex.id} asks for: write it yourself")
        self.kinds = []  # the answer contexts we are inside: "forward", "backward", "apply", "call"
        self._own_functions = []  # the answer's Function classes (an apply it wrote may run them)
        self.violations = []
        self._previous = None

    # ------------------------------------------------------------------ entering the answer
    def __enter__(self):
        self._previous = sys.gettrace()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._previous)
        return False

    @contextlib.contextmanager
    def inside(self, kind):
        """The answer's code runs in here (kind: "forward", "backward", "apply" or "call")."""
        if sys.gettrace() is not self._trace:  # an earlier refusal unset it (CPython does)
            sys.settrace(self._trace)
        self.kinds.append(kind)
        try:
            yield
        finally:
            self.kinds.pop()

    def _trace(self, frame, event, arg):
        if event != "call" or not self.kinds:
            return None
        code = frame.f_code
        reason = self.codes.get(code)
        if reason is None and self.kinds[-1] == "backward":
            reason = self.backward_codes.get(code)
            if reason is not None and frame.f_locals.get("cls") in self.references:  # Reference.apply
                reason = self.references[frame.f_locals["cls"]]
        elif reason is None and self.kinds[-1] == "apply" and code is _engine_apply():
            reason = self._foreign_op(frame.f_locals.get("cls"))
        if reason is not None:
            if reason not in self.violations:
                self.violations.append(reason)
            raise Forbidden(reason)
        return None

    def _foreign_op(self, cls):
        """Why an ``apply`` the answer wrote may not run ``cls``'s op (None: it is the answer's own)."""
        if not isinstance(cls, type) or any(issubclass(cls, own) for own in self._own_functions):
            return None
        if cls in self.references:
            return self.references[cls]
        return (f"the answer's apply runs tinymlp's {cls.__module__}.{cls.__qualname__} op and lets the engine "
                "differentiate it: leave apply to the engine (Function.apply) and write forward and backward")

    # ------------------------------------------------------------------ wrapping the answer
    def wrap(self, answer):
        """The answer, with every way into its code marked (a Function or Module class, a
        function, a module instance, or a tuple of those and data)."""
        from ..autograd import Function
        from ..nn import Module

        if isinstance(answer, type) and issubclass(answer, Function):
            return self._function(answer)
        if isinstance(answer, type) and issubclass(answer, Module):
            return self._module(answer)
        if isinstance(answer, tuple):
            return tuple(self.wrap(a) for a in answer)
        if isinstance(answer, Module):
            guarded = self._callable(answer.forward, "call")
            object.__setattr__(answer, "forward", guarded)
            return answer
        if callable(answer) and not isinstance(answer, type):
            return self._callable(answer, "call")
        return answer

    def _callable(self, fn, kind):
        guard = self

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            with guard.inside(kind):
                return fn(*args, **kwargs)
        return guarded

    def _function(self, cls):
        from ..autograd import Function

        guard = self
        fwd, bwd = cls.forward, cls.backward
        for code in _codes_of(fwd):  # re-running forward inside backward: a finite difference
            self.backward_codes.setdefault(code, (
                f"backward calls forward ({cls.__name__}.forward): re-running forward at nearby points is a finite "
                "difference, not a derivation; compute the gradient from the values forward saved"))

        class Guarded(cls):
            @staticmethod
            @functools.wraps(fwd)
            def forward(ctx, *args, **kwargs):
                with guard.inside("forward"):
                    return fwd(ctx, *args, **kwargs)

            @staticmethod
            @functools.wraps(bwd)
            def backward(ctx, grad):
                with guard.inside("backward"):
                    return bwd(ctx, grad)

            @classmethod
            def apply(klass, *args, **kwargs):
                if own_apply is None:
                    return Function.apply.__func__(klass, *args, **kwargs)
                with guard.inside("apply"):  # an apply the answer wrote: it may run its own op only
                    return own_apply.__get__(None, klass)(*args, **kwargs)

        own_apply = next((vars(c)["apply"] for c in cls.__mro__[:cls.__mro__.index(Function)]
                          if "apply" in vars(c)), None)
        self._own_functions.append(cls)
        Guarded.__name__, Guarded.__qualname__ = cls.__name__, cls.__qualname__
        Guarded.__module__, Guarded.__doc__ = cls.__module__, cls.__doc__
        return Guarded

    def _module(self, cls):
        guard = self

        class Guarded(cls):
            def __init__(self, *args, **kwargs):
                with guard.inside("call"):
                    super().__init__(*args, **kwargs)

            def forward(self, *args, **kwargs):
                with guard.inside("call"):
                    return super().forward(*args, **kwargs)

            def __call__(self, *args, **kwargs):  # Module's: calling the module calls forward
                with guard.inside("call"):
                    return self.forward(*args, **kwargs)

        Guarded.__name__, Guarded.__qualname__ = cls.__name__, cls.__qualname__
        Guarded.__module__, Guarded.__doc__ = cls.__module__, cls.__doc__
        return Guarded


def _where(obj):
    """``tinymlp/ops/norm.py``: the file of an object, relative to the package's parent."""
    try:
        path = inspect.getsourcefile(obj) or ""
    except TypeError:
        return getattr(obj, "__module__", "tinymlp")
    marker = path.rfind("tinymlp")
    return path[marker:].replace("\\", "/") if marker >= 0 else path


# ------------------------------------------------------------------------------ the snapshot
class Snapshot:
    """What tinymlp's and NumPy's modules hold, to compare after an answer's code has run.

    For each module whose name starts with ``tinymlp`` or ``numpy`` (and ``builtins``,
    ``math``): the identity of every attribute; for the classes and functions tinymlp defines:
    the identity of every class attribute and of each function's code and defaults; and the
    exercises' registry. ``changes()`` lists what differs, ignoring submodules imported since.
    """

    def __init__(self):
        self.state = self._take()

    @staticmethod
    def _watched():
        return {name: m for name, m in list(sys.modules.items())
                if isinstance(m, types.ModuleType)
                and (name in ("builtins", "math") or name.split(".")[0] in ("tinymlp", "numpy"))}

    def _take(self):
        from .registry import EXERCISES

        state = {}
        for name, module in self._watched().items():
            attrs = dict(vars(module))
            state[("module", name)] = {k: id(v) for k, v in attrs.items() if not isinstance(v, types.ModuleType)}
            if not name.startswith("tinymlp"):
                continue
            for key, value in attrs.items():
                if isinstance(value, type) and value.__module__ == name:
                    state[("class", f"{name}.{key}")] = {k: id(v) for k, v in vars(value).items()
                                                         if k not in ("__weakref__", "__dict__")}
                elif isinstance(value, types.FunctionType) and value.__module__ == name:
                    state[("function", f"{name}.{key}")] = {
                        "__code__": id(value.__code__), "__defaults__": id(value.__defaults__),
                        "__kwdefaults__": id(value.__kwdefaults__)}
        state[("registry", "tinymlp.lessons.EXERCISES")] = {k: (id(v), id(v.run)) for k, v in EXERCISES.items()}
        return state

    def changes(self):
        """What the answer changed, one line each (empty when nothing)."""
        now, out = self._take(), []
        for key, before in self.state.items():
            after = now.get(key)
            if after is None:
                continue
            for attr, value in before.items():
                if attr not in after:
                    out.append(f"{key[1]}.{attr} was deleted")
                elif after[attr] != value:
                    out.append(f"{key[1]}.{attr} was replaced")
            if key[0] == "registry":
                out += [f"{key[1]}[{k!r}] was added" for k in after if k not in before]
        return out
