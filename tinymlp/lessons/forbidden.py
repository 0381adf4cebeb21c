"""Running an answer with the library code that would do its exercise made unavailable.

An exercise asks for a piece the library already has: LayerNorm's backward is in
``tinymlp/ops/norm.py``, ``tinymlp.gradcheck`` computes any gradient numerically, and the
autograd engine differentiates any composition of ops. An answer that uses one of them has not
done the exercise. Inside a ``Guard``:

* the library code of the exercise (``Exercise.forbidden``: the reference Function and every
  class of tinymlp derived from it, the helpers behind it), numerical differentiation (every
  function of the ``tinymlp.gradcheck`` package and of ``tinymlp.testing``) and, in the
  answer's own process, the fast tier's implementations (``tinymlp/fast/<topic>.py``), are
  unavailable: their functions' code is replaced, so that whoever calls them (any class, any
  thread, any saved reference) gets ``Forbidden`` with a sentence that says what was called and
  why it is not allowed;
* the autograd engine is refused to the answer: ``Tensor.backward`` anywhere in its code, and any
  tinymlp op (``Function.apply``) or its own forward inside its backward (backward works on the
  arrays forward saved; re-running forward at nearby points is a finite difference);
* ``copies`` compares the answer's code with the forbidden code by content (its instructions,
  names and constants, not its file, lines or local names), so the library's code pasted or
  compiled into the answer is the library's code all the same.

In the answer's own process (``Guard(ex, process=True)``, see ``worker.py``) nothing else runs,
so the forbidden code refuses every caller. Where the check runs in the same process as the
answer (``check`` in a notebook) it refuses only while the answer's code runs, the check's own
references and its gradcheck being the library's ordinary callers, and ``__exit__`` puts
everything back. Each refusal is also recorded (``violations``), so an answer that catches the
exception still fails.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import hashlib
import importlib
import inspect
import sys
import types

__all__ = ["Forbidden", "Guard", "fingerprint", "functions_of", "resolve", "tinymlp_subclasses"]

_DIVERTED = {}  # key -> (guard, the original function, the reason)
_RAISED = []  # every refusal, in order (a refusal the answer catches is still a refusal)
_INSIDE = set()  # keys of the functions refused only while the answer's own code runs (library ops)
MIN_COPY = 20  # instructions: shorter functions (a one-line helper) may well be written alike independently
NUMERIC_MODULES = ("tinymlp.gradcheck", "tinymlp.testing")   # each with its submodules


class Forbidden(Exception):
    """Raised inside an answer that uses code the exercise does not allow."""

    def __init__(self, reason):
        super().__init__(reason)
        _RAISED.append(reason)


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


# ------------------------------------------------------------------------------ code by content
@functools.lru_cache(maxsize=None)
def fingerprint(code) -> str:
    """What a code object does, independent of its file, line numbers, docstring and local names:
    a hash of its instructions with their names and constants (nested code by its fingerprint)."""
    parts = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("CACHE", "RESUME", "NOP", "EXTENDED_ARG"):
            continue
        if ins.opname in ("LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_FAST_CHECK", "LOAD_CLOSURE",
                          "LOAD_DEREF", "STORE_DEREF", "MAKE_CELL", "LOAD_CLASSDEREF"):
            arg = ins.arg  # a local by its number: renaming it changes nothing
        elif isinstance(ins.argval, types.CodeType):
            arg = fingerprint(ins.argval)
        elif ins.opname.startswith(("JUMP", "POP_JUMP", "FOR_ITER", "SEND")) or "JUMP" in ins.opname:
            arg = ins.arg
        else:
            arg = repr(ins.argval)
        parts.append(f"{ins.opname} {arg}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def functions_of(obj):
    """The functions of an object: itself (a function), or those a class defines (not inherits)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return [f for part in (obj.fget, obj.fset, obj.fdel) if part for f in functions_of(part)]
    if isinstance(obj, functools.partial):
        return functions_of(obj.func)
    if isinstance(obj, types.MethodType):
        return functions_of(obj.__func__)
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(obj, type):
        return [f for value in list(vars(obj).values()) for f in functions_of(value)]
    return []


def _codes(code):
    """A code object and the code objects nested in it (functions, lambdas, comprehensions)."""
    out, stack = [], [code]
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


@functools.lru_cache(maxsize=None)
def _size(code):
    return sum(1 for ins in dis.get_instructions(code) if ins.opname not in ("CACHE", "RESUME", "NOP"))


def tinymlp_subclasses(cls):
    """A class and the classes of tinymlp derived from it (the fast tier derives its versions)."""
    out, stack = [], [cls]
    while stack:
        c = stack.pop()
        if c is cls or c.__module__.startswith("tinymlp."):
            out.append(c)
            stack.extend(c.__subclasses__())
    return out


def library_ops():
    """The library's ops: the Function classes of ``tinymlp/ops/`` and ``tinymlp/fast/``, except the
    shape ops (a reshape or an index does no arithmetic a student is asked to write)."""
    from ..autograd import Function

    return [cls for cls in tinymlp_subclasses(Function) if cls.__module__.startswith(("tinymlp.ops.", "tinymlp.fast."))
            and cls.__module__ not in ("tinymlp.ops.shape", "tinymlp.fast.shape")]


def where(obj) -> str:
    """``tinymlp/ops/norm.py``: the file of an object, relative to the package's parent."""
    try:
        path = inspect.getsourcefile(obj) or ""
    except TypeError:
        return getattr(obj, "__module__", "tinymlp")
    marker = path.rfind("tinymlp")
    return path[marker:].replace("\\", "/") if marker >= 0 else path


def _module_functions(module):
    """The functions (and methods of classes) a module defines (not those it imports or inherits)."""
    found = []
    for value in list(vars(module).values()):
        if getattr(value, "__module__", None) == module.__name__ and isinstance(value, (types.FunctionType, type)):
            found += [f for f in functions_of(value) if f.__module__ == module.__name__]
    return found


# ------------------------------------------------------------------------------ diverting a function
def divert(key, args, kwargs):
    """What a diverted library function runs: a refusal inside the answer, else the function."""
    guard, original, reason = _DIVERTED[key]
    if guard.kinds or (guard.process and key not in _INSIDE):
        raise Forbidden(reason)
    return original(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _stub(n_free):
    """The code that calls ``divert``, with ``n_free`` free variables (a function's code can only
    be replaced by code with as many as it has)."""
    names = [f"_free{i}" for i in range(n_free)]
    lines = ["def _outer():"]
    lines += [f"    {name} = None" for name in names]
    lines += ["    def _diverted(*args, **kwargs):"]
    lines += [f"        {name}" for name in names]
    lines += ["        from tinymlp.lessons.forbidden import divert", "        return divert(-1, args, kwargs)",
              "    return _diverted"]
    scope = {}
    exec(compile("\n".join(lines), "<tinymlp.lessons.forbidden>", "exec"), scope)  # noqa: S102 (our own stub)
    return scope["_outer"]().__code__


class Guard:
    """Run an exercise's answer with the code it may not use unavailable (see the module docstring).

    ``with Guard(exercise) as guard: exercise.run(answer, case)``; ``guard.violations`` lists
    every refusal, ``guard.copies(objects)`` the answer's code that is the forbidden code.
    ``process=True``: the answer's own process, where every caller is refused and the fast tier
    is unavailable too.
    """

    def __init__(self, ex, *, process=False):
        self.ex, self.process = ex, process
        self.kinds = []  # the answer's code running now: "forward", "backward", "call"
        self._start = len(_RAISED)
        self._replaced = []  # (function, original code) to put back
        self._patched = []  # (class, attribute, original value or None) to put back
        self.reasons = {}  # fingerprint -> sentence, for copies
        self.forbidden = []  # (function, sentence)
        for dotted in ex.forbidden:
            obj = resolve(dotted)
            for item in tinymlp_subclasses(obj) if isinstance(obj, type) else [obj]:
                module = getattr(item, "__module__", None) or dotted.rsplit(".", 1)[0]
                for fn in functions_of(item):
                    name = f"{module}.{fn.__qualname__}"
                    self.forbidden.append((fn, f"the answer calls {name} ({where(item)}), the library's own "
                                               f"implementation of what exercise {ex.id} asks for: write it yourself"))
        numeric = [m for name, m in list(sys.modules.items())
                   if isinstance(m, types.ModuleType) and name.startswith(NUMERIC_MODULES)]
        for module in numeric:
            for fn in _module_functions(module):
                self.forbidden.append((fn, f"the answer calls {module.__name__}'s {fn.__qualname__} (numerical "
                                           "differentiation): derive the gradient by hand instead of estimating it"))
        if process:
            # the fast tier's implementations (its package, which switches the tier, stays available)
            fast = [m for name, m in list(sys.modules.items())
                    if isinstance(m, types.ModuleType) and name.startswith("tinymlp.fast.")]
            for module in fast:
                for fn in _module_functions(module):
                    self.forbidden.append((fn, f"the answer calls {module.__name__}.{fn.__qualname__}, the library's "
                                               "fast tier (compiled versions of the same ops): write the computation "
                                               "yourself"))
        self.ops = []  # (function, sentence): refused only while the answer's code runs
        if getattr(ex, "derived", False):
            for cls in library_ops():
                for fn in functions_of(cls):
                    if fn.__name__ in ("forward", "backward"):
                        self.ops.append((fn, f"the answer's code calls {cls.__module__}.{fn.__qualname__} "
                                                f"({where(cls)}), a library op, while its own code runs: in exercise "
                                                f"{ex.id} the computation is yours, and a Function that wraps a "
                                                "library op (or a backward that calls one) is not the exercise"))
        for fn, reason in self.forbidden:
            if _size(fn.__code__) >= MIN_COPY:
                copied = reason.replace("the answer calls", "the answer's code is", 1)
                self.reasons.setdefault(fingerprint(fn.__code__), copied)
        self._marked = set()
        self.ran = set()  # names of the answer's Functions whose backward has run

    @property
    def violations(self):
        """Every refusal since the guard was made, one sentence each."""
        return list(dict.fromkeys(_RAISED[self._start:]))

    # ------------------------------------------------------------------ entering and leaving
    def __enter__(self):
        for fn, reason in self.forbidden:
            self._divert(fn, reason)
        for fn, reason in self.ops:
            self._divert(fn, reason, inside=True)
        self._engine()
        self.mark_answer()
        return self

    def __exit__(self, *exc):
        for fn, code in reversed(self._replaced):
            fn.__code__ = code
        for cls, name, value in reversed(self._patched):
            if value is None:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        self._replaced, self._patched = [], []
        for key in [k for k, (g, _, _) in _DIVERTED.items() if g is self]:
            del _DIVERTED[key]
            _INSIDE.discard(key)
        return False

    def _divert(self, fn, reason, inside=False):
        code = fn.__code__
        if any(f is fn for f, _ in self._replaced):
            return
        original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        original.__kwdefaults__ = fn.__kwdefaults__
        key = id(original)
        _DIVERTED[key] = (self, original, reason)
        if inside:
            _INSIDE.add(key)
        stub = _stub(len(code.co_freevars))
        stub = stub.replace(co_consts=tuple(key if c == -1 else c for c in stub.co_consts))
        self._replaced.append((fn, code))
        fn.__code__ = stub

    @contextlib.contextmanager
    def inside(self, kind):
        """The answer's code runs in here (kind: "forward", "backward" or "call")."""
        self.kinds.append(kind)
        try:
            yield
        finally:
            self.kinds.pop()

    def _patch(self, cls, name, value):
        self._patched.append((cls, name, vars(cls).get(name)))
        setattr(cls, name, value)

    # ------------------------------------------------------------------ the engine
    def _engine(self):
        from ..autograd import Function
        from ..tensor import Tensor

        guard, apply, backward = self, Function.apply.__func__, Tensor.backward

        def guarded_apply(cls, *args, **kwargs):
            if guard.kinds and guard.kinds[-1] == "backward":
                raise Forbidden("backward calls a tinymlp op (Function.apply: F.*, Tensor arithmetic): backward works "
                                "on the raw arrays forward saved, with NumPy (xp), and builds no graph")
            return apply(cls, *args, **kwargs)

        def guarded_backward(tensor, *args, **kwargs):
            if guard.kinds:
                raise Forbidden("the answer runs tinymlp's autograd engine (Tensor.backward) to get a gradient: derive "
                                "the gradient by hand and compute it with NumPy")
            return backward(tensor, *args, **kwargs)

        guarded_apply.__doc__, guarded_backward.__doc__ = apply.__doc__, backward.__doc__
        self._patch(Function, "apply", classmethod(guarded_apply))
        self._patch(Tensor, "backward", guarded_backward)

    @staticmethod
    def engine_apply(cls, *args, **kwargs):
        """The engine's ``Function.apply`` for ``cls``, whatever ``apply`` the answer defines."""
        from ..autograd import Function

        return Function.apply.__func__(cls, *args, **kwargs)

    def mark_answer(self):
        """Mark where the answer's code runs: the forward and backward of every Function, and the
        forward of every Module, defined outside tinymlp (call again after new ones are defined)."""
        from ..autograd import Function
        from ..nn import Module

        for base, names in ((Function, ("forward", "backward")), (Module, ("forward",))):
            stack, seen = list(base.__subclasses__()), set()
            while stack:
                cls = stack.pop()
                if cls in seen:
                    continue
                seen.add(cls)
                stack.extend(cls.__subclasses__())
                if cls.__module__.startswith("tinymlp.") or cls in self._marked:
                    continue
                self._marked.add(cls)
                for name in names:
                    if name in vars(cls):
                        self._mark(cls, name, base is Function)

    def _mark(self, cls, name, static):
        guard, value = self, vars(cls)[name]
        fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if not callable(fn):
            return
        kind = name if static else "call"

        @functools.wraps(fn)
        def marked(*args, **kwargs):
            if kind == "forward" and guard.kinds and guard.kinds[-1] == "backward":
                raise Forbidden(f"backward calls forward ({cls.__name__}.forward): re-running forward at nearby "
                                "points is a finite difference, not a derivation; compute the gradient from the values "
                                "forward saved")
            if kind == "backward":
                guard.ran.add(cls.__qualname__)
            with guard.inside(kind):
                return fn(*args, **kwargs)

        wrapped = staticmethod(marked) if isinstance(value, staticmethod) else (
            classmethod(marked) if isinstance(value, classmethod) else marked)
        self._patch(cls, name, wrapped)

    def calling(self, fn):
        """``fn`` (an answer that is a plain function), marked as the answer's code."""
        guard = self

        @functools.wraps(fn)
        def marked(*args, **kwargs):
            with guard.inside("call"):
                return fn(*args, **kwargs)
        return marked

    # ------------------------------------------------------------------ copies
    def copies(self, *objects):
        """Sentences for the answer's functions whose code is the forbidden code (by content)."""
        found, seen = [], set()
        stack = list(objects)
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, (tuple, list)):
                stack.extend(obj)
                continue
            for fn in functions_of(obj):
                found += self.copied(fn.__code__, fn.__qualname__)
        return list(dict.fromkeys(found))

    def copied(self, code, name=None):
        """Sentences for the functions of compiled ``code`` (nested ones too) that are the forbidden
        code by content: the grader asks this of the answer's program, compiled and never run."""
        found = []
        for c in _codes(code):
            if c.co_name.startswith("<") or _size(c) < MIN_COPY:
                continue  # modules, comprehensions, lambdas and one-liners: alike by necessity
            reason = self.reasons.get(fingerprint(c))
            if reason:
                found.append(f"{name or getattr(c, 'co_qualname', c.co_name)}: {reason}")
        return found
