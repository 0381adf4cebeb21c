"""What an answer's code may not contain, read from its syntax before it runs.

The grader reads the program that defines an answer (``notebook.py``) and, before starting the
process that runs it, ``refusals`` lists what makes it fail at once, each with its cell and line:

* imports beyond NumPy, math, tinymlp and a few standard helpers, tinymlp's fast tier, the
  checks' own references (``tinymlp.lessons.checks``);
* code built or run at run time (``exec``, ``eval``, ``compile``, ``__import__``, ``getattr``
  with a name built at run time), files (``open``), and reaching into the interpreter (frames,
  ``sys.modules``, ``__globals__``, ``__code__``, ``__builtins__``, ``os._exit``);
* a statement before the check that may define the answer's names in a way the grader cannot
  follow (``exec(source, scope)``, ``globals().update(...)``): the grader keeps the
  statements that assign, define or import them, and would otherwise drop it silently;
* for an exercise that asks for a derivative (``Exercise.derived``): complex numbers (``1j``,
  ``np.imag``, a complex dtype), which no derivative of the course needs and which a complex-step
  estimate is made of.

``flags`` lists what the instructor should look at, without failing the answer: a number type
of the answer's own (a class with arithmetic operators: dual numbers carry derivatives without
deriving them) and a division by a small step after evaluating a function at shifted points
(a finite difference), in an exercise that asks for a derivative. The answer's process
(``confine.py``, ``forbidden.py``) refuses the same things at run time, however they are spelled.
"""

from __future__ import annotations

import ast
import functools

__all__ = ["ALLOWED_IMPORTS", "copies", "flags", "own_apply", "refusals", "unplaced"]

ALLOWED_IMPORTS = {
    "__future__", "numpy", "math", "cmath", "tinymlp", "checks", "functools", "itertools", "collections",
    "typing", "dataclasses", "operator", "string", "re", "random", "time", "warnings", "abc", "enum", "copy",
    "numbers", "statistics", "matplotlib", "cupy",
}
"""Modules an answer (and what it needs) may import: the course's own and a few plain helpers."""

FORBIDDEN_NAMES = {
    "exec": "runs code the grader cannot read", "eval": "runs code the grader cannot read",
    "compile": "builds code the grader cannot read", "__import__": "imports behind the grader's back",
    "open": "reads or writes files", "globals": "reaches into the module's namespace",
    "locals": "reaches into a namespace", "vars": "reaches into a namespace",
    "breakpoint": "stops to wait for a debugger", "input": "waits for keyboard input",
    "__builtins__": "changes the built-in functions",
}
FORBIDDEN_ATTRIBUTES = {
    "_getframe": "reads the interpreter's call stack", "f_back": "reads the interpreter's call stack",
    "f_locals": "reads another frame's variables", "f_globals": "reads another frame's variables",
    "f_code": "reads the interpreter's call stack", "tb_frame": "reads the interpreter's call stack",
    "gi_frame": "reads the interpreter's call stack", "gi_code": "reads a generator's code",
    "__globals__": "reaches into another module's namespace", "__code__": "rewrites a function's code",
    "__closure__": "reaches into another function's variables", "__builtins__": "changes the built-in functions",
    "__subclasses__": "searches the interpreter's classes", "settrace": "changes the interpreter's tracing",
    "setprofile": "changes the interpreter's tracing", "modules": "changes the loaded modules (sys.modules)",
    "_exit": "ends the process", "__dict__": "rewrites an object's attributes behind its back",
    "__loader__": "reloads library code", "__spec__": "reloads library code",
    "__self__": "reaches the module of a built-in function (the built-ins)", "f_builtins": "changes the built-ins",
    "__mro__": "searches the interpreter's classes", "__bases__": "searches the interpreter's classes",
    "__base__": "searches the interpreter's classes", "__getattribute__": "reads attributes behind the grader's back",
    "_DIVERTED": "reaches into the grader's guard", "_RAISED": "reaches into the grader's guard",
}
GRADER = {"check", "skipped", "case", "EXERCISES"}
"""What of ``tinymlp.lessons`` a notebook uses: the rest is the grader's (its guard, its processes)."""
DYNAMIC = {"getattr", "setattr", "delattr"}
BINDING_CALLS = {"exec", "eval", "compile", "globals", "locals", "vars", "__import__", "setattr"}
COMPLEX_NAMES = {"complex", "complex64", "complex128", "complex256", "complex_", "cdouble", "csingle",
                 "clongdouble", "cfloat", "longcomplex", "imag", "iscomplexobj", "emath", "scimath", "conj",
                 "conjugate", "angle", "iscomplex", "real_if_close"}
EXTENDED = {"longdouble", "float128", "float96", "longfloat", "clongdouble", "complex256", "Decimal", "Fraction",
            "mpf", "mpmath"}
EXTENDED_DTYPES = {"g", "f16", "f12", "longdouble", "float128", "float96"}
COMPLEX_DTYPES = {"complex", "complex64", "complex128", "c8", "c16", "D", "F", "G"}
ARITHMETIC = {"__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__rtruediv__", "__pow__", "__neg__"}
SMALL_STEP = 0.1


def _at(st, node):
    return f"({st.filename.strip('<>')}, line {getattr(node, 'lineno', st.node.lineno)})"


def refusals(program, ex) -> list:
    """What the answer's program may not contain, one sentence each (see the module docstring)."""
    found = []
    for st in program.statements:
        for node in ast.walk(st.node):
            found += _refused(st, node)
            if ex.derived:
                found += _complex(st, node)
    found += unplaced(program)
    return list(dict.fromkeys(found))


def unplaced(program) -> list:
    """The statements before the check call that may define the answer's names in a way the grader
    cannot follow, and that it therefore did not keep, one sentence each."""
    kept = {id(st) for st in program.statements}
    return [line for st in program.before if id(st) not in kept for line in _unplaced(st)]


def _refused(st, node):
    at = _at(st, node)
    reached = _grader_module(node)
    if reached:
        return [f"the answer's code reaches into the grader ({reached} {at}), whose guard and processes the answer "
                "must not touch: an answer computes with NumPy and tinymlp"]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.level:
            names = ["." * node.level + (node.module or "")]
        if isinstance(node, ast.ImportFrom) and node.module == "tinymlp.lessons":
            names += [f"tinymlp.lessons.{a.name}" for a in node.names if a.name == "checks"]
        out = []
        for name in names:
            if name in ("tinymlp.fast", "tinymlp.dispatch") or name.startswith("tinymlp.fast."):
                out.append(f"the answer's code imports {name} {at}, the library's fast tier (compiled kernels of "
                           "the same ops): write the computation yourself")
            elif name == "tinymlp.lessons.checks" or name.startswith("tinymlp.lessons.checks."):
                out.append(f"the answer's code imports {name} {at}, the checks' own references: write the "
                           "computation yourself")
            elif name.split(".")[0] not in ALLOWED_IMPORTS:
                out.append(f"the answer's code imports {name} {at}: an answer may import numpy, math, tinymlp and "
                           "the standard helpers (functools, itertools, collections, ...)")
        return out
    if isinstance(node, ast.Call) and _called(node) in ("attrgetter", "methodcaller"):
        names = node.args[:1] if _called(node) == "methodcaller" else node.args
        for name in names:
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                return [f"the answer's code calls {_called(node)} with an attribute name built at run time {at}: "
                        "name the attribute"]
            bad = [part for part in name.value.split(".") if part in FORBIDDEN_ATTRIBUTES]
            if bad:
                return [f"the answer's code uses .{bad[0]} {at}, which {FORBIDDEN_ATTRIBUTES[bad[0]]}"]
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        return [f"the answer's code uses {node.id} {at}, which {FORBIDDEN_NAMES[node.id]}"]
    if isinstance(node, ast.Attribute) and node.attr == "fast" and _root(node) is not None:
        return [f"the answer's code uses .fast {at}, the library's fast tier (compiled kernels of the same ops): "
                "write the computation yourself"]
    if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
        return [f"the answer's code uses .{node.attr} {at}, which {FORBIDDEN_ATTRIBUTES[node.attr]}"]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DYNAMIC:
        name = node.args[1] if len(node.args) > 1 else None
        if name is not None and not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return [f"the answer's code calls {node.func.id} with an attribute name built at run time {at}: "
                    "name the attribute"]
        if isinstance(name, ast.Constant) and name.value in FORBIDDEN_ATTRIBUTES:
            return [f"the answer's code uses .{name.value} {at}, which {FORBIDDEN_ATTRIBUTES[name.value]}"]
    return []


def _called(call):
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _grader_module(node):
    """``tinymlp.lessons.forbidden`` (or the like) when the node imports or names a module of the
    grader's, else ""."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module == "tinymlp.lessons":
        names = [f"tinymlp.lessons.{a.name}" for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module]
    elif isinstance(node, ast.Attribute):
        names = [ast.unparse(node)]
    for name in names:
        parts = name.split(".")
        if parts[:2] == ["tinymlp", "lessons"] and len(parts) > 2 and parts[2] not in GRADER | {"checks"}:
            return ".".join(parts[:3])
    return ""


def _complex(st, node):
    at = _at(st, node)
    why = ("a complex-step derivative estimates the gradient instead of deriving it, and no derivative of the "
           "course needs complex numbers: derive the formula")
    if isinstance(node, ast.Constant) and isinstance(node.value, complex):
        return [f"the answer computes with complex numbers ({ast.unparse(node)} {at}): {why}"]
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name in COMPLEX_NAMES:
        return [f"the answer computes with complex numbers ({name} {at}): {why}"]
    if isinstance(node, ast.Call):
        dtypes = [k.value for k in node.keywords if k.arg == "dtype"]
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("astype", "view") and node.args:
            dtypes.append(node.args[0])
        for d in dtypes:
            if isinstance(d, ast.Constant) and isinstance(d.value, str) and d.value.lstrip("<>=") in COMPLEX_DTYPES:
                return [f"the answer computes with complex numbers (dtype {d.value!r} {at}): {why}"]
    return []


def _unplaced(st):
    for node in _walk_outside_functions(st.node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BINDING_CALLS:
            return [f"{st.filename.strip('<>')}, line {node.lineno}: {ast.unparse(node)[:60]} may define or change "
                    "names of the answer in a way the grader cannot follow (it keeps the statements that assign, "
                    "define or import them): write them as plain assignments, definitions and imports"]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id in BINDING_CALLS):
            return [f"{st.filename.strip('<>')}, line {node.lineno}: {ast.unparse(node)[:60]} defines names the "
                    "grader cannot see: write them as plain assignments"]
    return []


def _walk_outside_functions(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(n))


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


# ------------------------------------------------------------------------------ flags
def flags(program, ex) -> list:
    """What the instructor should look at in an answer to a derivative exercise (module docstring)."""
    if not ex.derived:
        return []
    found = []
    for st in program.statements:
        for node in ast.walk(st.node):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
                ops = sorted(_operators(node) & ARITHMETIC)
                if len(ops) >= 2 and not bases & {"Function", "Module", "Exception", "Tensor"}:
                    found.append(f"defines its own number type, {node.name} ({', '.join(ops)}) {_at(st, node)}: "
                                 "dual numbers compute a derivative without deriving it")
            found += _made_number_type(st, node) + _extended(st, node)
            if isinstance(node, ast.ClassDef):
                found += _forward_in_backward(st, node)
            if isinstance(node, (ast.FunctionDef, ast.Lambda)):
                step = _finite_difference(node)
                if step:
                    found.append(f"divides by a small step ({step}) after evaluating at shifted points "
                                 f"{_at(st, node)}: a finite difference")
    return list(dict.fromkeys(found))


def _operators(cls):
    """The names a class body defines or assigns (``def __add__``, ``__radd__ = __add__``)."""
    names = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for item in cls.body:
        targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(
            item, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _made_number_type(st, node):
    """A number type made without a class body: ``type("D", (), {"__add__": ...})`` or
    ``setattr(D, "__mul__", ...)`` / ``D.__mul__ = ...``."""
    ops = set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and len(
            node.args) == 3 and isinstance(node.args[2], ast.Dict):
        ops = {k.value for k in node.args[2].keys if isinstance(k, ast.Constant)} & ARITHMETIC
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(
            node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in ARITHMETIC:
        ops = {node.args[1].value}
    elif isinstance(node, ast.Assign):
        ops = {t.attr for t in node.targets if isinstance(t, ast.Attribute)} & ARITHMETIC
    if not ops:
        return []
    return [f"gives a type arithmetic operators at run time ({', '.join(sorted(ops))} {_at(st, node)}): a number "
            "type of its own (dual numbers) computes a derivative without deriving it"]


def _extended(st, node):
    """Extended precision (``np.longdouble``, ``float128``, a ``"g"`` dtype): where a difference
    quotient becomes exact enough to pass for a derived gradient."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    if name not in EXTENDED and isinstance(node, ast.Call):
        dtypes = [k.value for k in node.keywords if k.arg == "dtype"]
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("astype", "view") and node.args:
            dtypes.append(node.args[0])
        name = next((repr(d.value) for d in dtypes if isinstance(d, ast.Constant) and isinstance(d.value, str)
                     and d.value.lstrip("<>=") in EXTENDED_DTYPES), None)
    if name in EXTENDED or (name and name.startswith("'")):
        return [f"computes in extended precision ({name} {_at(st, node)}): a difference quotient in extended "
                "precision can pass for a derived gradient"]
    return []


def _forward_in_backward(st, cls):
    """A Function whose backward calls its forward (``Cls.forward``, ``cls.forward``)."""
    found = []
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "backward":
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "forward":
                    found.append(f"backward calls forward ({ast.unparse(call.func)} {_at(st, call)}): forward at "
                                 "other points is a finite difference, not a derivation")
    return found


def _small(node, steps):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return 0 < abs(node.value) <= SMALL_STEP
    if isinstance(node, ast.Name):
        return node.id in steps
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return (_small(node.left, steps) and isinstance(node.right, ast.Constant)) or (
            _small(node.right, steps) and isinstance(node.left, ast.Constant))
    if isinstance(node, ast.UnaryOp):
        return _small(node.operand, steps)
    return False


def _finite_difference(fn):
    """The step of a finite difference in ``fn`` (a division by a small step, and a call at a point
    shifted by it), or None."""
    steps = set()
    args = fn.args
    for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
        if _small(default, set()):
            steps.add(arg.arg)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and _small(node.value, set()):
            steps |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    shifts, grown = set(steps), True
    while grown:  # e[i] = h, e = h * unit: arrays that carry the step
        grown = False
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id in shifts
                                                    for n in ast.walk(node.value)):
                for target in node.targets:
                    root = _root(target)
                    if root is not None and root not in shifts:
                        shifts.add(root)
                        grown = True
    divided = [n for n in ast.walk(fn) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
               and _small(n.right, steps)]
    if not divided:
        return None
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        for arg in call.args:
            for n in ast.walk(arg):
                if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)) and (
                        _carries(n.left, shifts) or _carries(n.right, shifts)):
                    return ast.unparse(divided[0].right)
    return None


def _carries(node, shifts):
    """Whether an operand is a step: a small constant, a name that holds one, or a product with one."""
    if _small(node, shifts):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        return _carries(node.left, shifts) or _carries(node.right, shifts)
    return False


def copies(program, ex) -> list:
    """Flags for the answer's functions whose code is the exercise's forbidden code instruction for
    instruction, pasted or renamed (by content: ``forbidden.Guard.copied``); the program is
    compiled, never run. A flag, not a refusal: a short canonical formula can come out the same."""
    guard = _guard(ex)
    found = []
    for st in program.statements:
        try:
            code = compile(ast.Module(body=[st.node], type_ignores=[]), st.filename, "exec")
        except (SyntaxError, ValueError):
            continue
        found += [f"{line.replace(': write it yourself', '')} (instruction for instruction, names aside; "
                  f"{_at(st, st.node)[1:-1]})"
                  for line in guard.copied(code)]
    return list(dict.fromkeys(found))


@functools.lru_cache(maxsize=None)
def _guard(ex):
    from .forbidden import Guard

    return Guard(ex, process=True)


def own_apply(program) -> str:
    """A note when the answer's program gives a class its own ``apply`` (the grader runs forward
    and backward through the engine's), else ""."""
    for st in program.statements:
        for node in ast.walk(st.node):
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "apply"
                                                      for f in node.body):
                return (f"note: {node.name} defines its own apply {_at(st, node)}; the grader runs forward and "
                        "backward through the engine's apply, as the exercise asks")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "apply"
                                                    for t in node.targets):
                return (f"note: the notebook replaces {ast.unparse(node.targets[0])} {_at(st, node)}; the grader runs "
                        "forward and backward through the engine's apply, as the exercise asks")
    return ""
