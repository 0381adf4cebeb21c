"""The student edition of tinymlp that an answer's sandbox sees: the library without the code of
the exercise.

``edition(exercise, forbidden)`` is a folder holding a copy of the ``tinymlp`` package in which

* every function of the exercise's forbidden code (the reference Function and the tinymlp
  classes derived from it, the fast tier's versions among them, and the helpers named) has its
  body replaced by a ``raise`` that says so, and so have the functions of the fast tier's files
  for the same topic (``fast/norm.py``, ``fast/kernels/norm_*.py`` for ``ops/norm.py``);
* every function of numerical differentiation (``tinymlp/gradcheck/``, ``tinymlp/testing.py``)
  has its body replaced the same way;
* the checks (``tinymlp/lessons/checks/``: the references) and the grader's own modules are
  not there at all.

The sandbox shows this folder read-only in place of the library (``sandbox.py``), so the code
an answer must not use is in no file, no module and no compiled cache that the answer's process
can reach, however it reaches. The modules keep their names, classes and signatures, so the rest
of the library imports and runs as before. ``forbidden.py``'s refusals stay as a second layer.
Editions are built once per exercise and grading run, in a temporary folder removed at exit.
"""

from __future__ import annotations

import ast
import atexit
import compileall
import inspect
import pathlib
import shutil
import tempfile

__all__ = ["edition"]

PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # tinymlp/
NOT_SHIPPED = ("lessons/checks", "lessons/grader.py", "lessons/reports.py", "lessons/similarity.py",
               "lessons/identity.py", "lessons/output.py", "lessons/sandbox.py", "lessons/edition.py",
               "lessons/execute.py", "lessons/__main__.py", "__main__.py")
NUMERIC = ("gradcheck", "testing.py")
_BUILT = {}
_FOLDER = []


def edition(exercise, forbidden=()) -> pathlib.Path:
    """The folder holding exercise ``exercise``'s edition of tinymlp (its ``tinymlp/`` inside)."""
    key = (exercise, tuple(forbidden))
    if key not in _BUILT:
        if not _FOLDER:
            _FOLDER.append(pathlib.Path(tempfile.mkdtemp(prefix="tinymlp-editions-")))
            atexit.register(shutil.rmtree, _FOLDER[0], True)
        folder = _FOLDER[0] / f"{len(_BUILT)}"
        _build(folder / "tinymlp", exercise, forbidden)
        _BUILT[key] = folder
    return _BUILT[key]


def _build(dest, exercise, forbidden):
    shutil.copytree(PACKAGE, dest)  # compiled caches too: they are valid for the files left as they are
    for name in NOT_SHIPPED:
        path = dest / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
            _uncache(path)
    for path, functions in targets(exercise, forbidden).items():
        copy = dest / path
        if copy.exists():
            copy.write_text(strip(copy.read_text(encoding="utf-8"), functions), encoding="utf-8")
            _uncache(copy)  # the original's compiled code goes with it
            compileall.compile_file(str(copy), quiet=2)
    for path in sorted(dest.rglob("*"), reverse=True):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _uncache(path):
    for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
        cached.unlink()


def targets(exercise, forbidden) -> dict:
    """{file relative to tinymlp/: {qualified name or "*" (every function): why it is not there}}."""
    from .forbidden import functions_of, resolve, tinymlp_subclasses

    out = {}
    topics = set()
    for dotted in forbidden:
        obj = resolve(dotted)
        why = f"it is what exercise {exercise} asks for"
        for item in tinymlp_subclasses(obj) if isinstance(obj, type) else [obj]:
            for fn in functions_of(item):
                file = _relative(fn)
                if file and "<locals>" not in fn.__qualname__:
                    out.setdefault(file, {})[fn.__qualname__] = why
        module = getattr(obj, "__module__", "") or ""
        if module.startswith("tinymlp.ops."):
            topics.add(module.rsplit(".", 1)[1])
    for topic in sorted(topics):
        why = f"the fast tier's version of what exercise {exercise} asks for"
        for path in [PACKAGE / "fast" / f"{topic}.py", *sorted((PACKAGE / "fast" / "kernels").glob(f"{topic}_*.py"))]:
            if path.exists():
                out.setdefault(path.relative_to(PACKAGE).as_posix(), {})["*"] = why
    for name in NUMERIC:
        paths = sorted((PACKAGE / name).glob("*.py")) if (PACKAGE / name).is_dir() else [PACKAGE / name]
        for path in paths:
            if path.name != "__init__.py":
                out.setdefault(path.relative_to(PACKAGE).as_posix(), {})["*"] = "numerical differentiation"
    return out


def _relative(fn):
    try:
        path = pathlib.Path(inspect.getsourcefile(fn) or "").resolve()
    except TypeError:
        return None
    try:
        return path.relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def strip(source, functions) -> str:
    """``source`` with the bodies of ``functions`` ({qualified name or "*": why}) replaced by a raise."""
    tree = ast.parse(source)
    module = None

    class Strip(ast.NodeTransformer):
        def __init__(self):
            self.scope = []

        def visit_ClassDef(self, node):
            self.scope.append(node.name)
            self.generic_visit(node)
            self.scope.pop()
            return node

        def visit_FunctionDef(self, node):
            name = ".".join(self.scope + [node.name])
            why = functions.get(name) or functions.get("*")
            if why is None:
                self.scope += [node.name, "<locals>"]
                self.generic_visit(node)
                del self.scope[-2:]
                return node
            text = f"{module or 'tinymlp'}: {name} is not in the answer's edition of the library ({why})"
            node.body = [ast.Raise(exc=ast.Call(func=ast.Name("RuntimeError", ast.Load()),
                                                args=[ast.Constant(text)], keywords=[]), cause=None)]
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

    tree = ast.fix_missing_locations(Strip().visit(tree))
    return ast.unparse(tree) + "\n"
