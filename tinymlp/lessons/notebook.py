"""An exercise's answer, read from a notebook's code: the program that defines it, and nothing else.

The grader does not take answers from the notebook's kernel (whatever ran there could have
changed them, or the checker) nor from its printed output. It reads the notebook's code cells
and, for each exercise, keeps the statements its answer needs:

1. the answer is the second argument of the last ``check("04.1", ...)`` call in the notebook
   (or, if the student deleted that line, the name the lesson gives it, ``MyLayerNorm``);
2. going back from that call, every top-level statement that binds (or changes, such as
   ``W[0] = ...`` or ``rng.shuffle(a)``) a name the answer uses is kept, then the names those
   statements use, until nothing is added: imports, helper functions, constants;
3. the kept statements are compiled with the notebook's name, cell number and line numbers,
   so that an error inside the answer points at the student's own line.

``scan`` then refuses what an exercise answer never needs and what could change its grade:
imports beyond NumPy, math, tinymlp and a few standard helpers, tinymlp's fast tier (compiled
kernels the tracing guard cannot see into), ``exec``/``eval``, ``open``, and reaching into the
interpreter (frames, ``sys.modules``, ``__globals__``, ``os._exit``).
"""

from __future__ import annotations

import ast
import builtins
import json
import pathlib
import re
import symtable
from dataclasses import dataclass, field

__all__ = ["Notebook", "Program", "ALLOWED_IMPORTS"]

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
    "breakpoint": "stops to wait for a debugger", "input": "waits for keyboard input",
}
FORBIDDEN_ATTRIBUTES = {
    "_getframe": "reads the interpreter's call stack", "f_back": "reads the interpreter's call stack",
    "f_locals": "reads another frame's variables", "f_globals": "reads another frame's variables",
    "tb_frame": "reads the interpreter's call stack", "gi_frame": "reads the interpreter's call stack",
    "__globals__": "reaches into another module's namespace", "__code__": "rewrites a function's code",
    "__closure__": "reaches into another function's variables", "__builtins__": "changes the built-in functions",
    "__subclasses__": "searches the interpreter's classes", "settrace": "changes the interpreter's tracing",
    "setprofile": "changes the interpreter's tracing", "modules": "changes the loaded modules (sys.modules)",
    "_exit": "ends the process", "__dict__": "rewrites an object's attributes behind its back",
}


@dataclass
class Statement:
    """One top-level statement of a code cell."""

    cell: int  # 1-based, counting every cell (markdown too) from the top of the notebook
    filename: str  # what tracebacks show: "<alice/04_layernorm.ipynb, cell 14>"
    node: ast.stmt
    binds: set = field(default_factory=set)
    uses: set = field(default_factory=set)


@dataclass
class Program:
    """What the grader runs for one exercise: the statements, then the answer expression."""

    ex_id: str
    answer: str  # the expression, as the notebook writes it: "MyLayerNorm", "(my_layer, layer_inputs)"
    statements: list
    sources: dict  # filename -> the cell's (transformed) source, for tracebacks
    found: bool  # False: nothing in the notebook defines the answer
    problems: list = field(default_factory=list)  # what scan refused, one sentence each

    def scan(self):
        """Fill ``problems`` with what the answer's code may not do (see the module docstring)."""
        self.problems = []
        for st in self.statements:
            for node in ast.walk(st.node):
                line = getattr(node, "lineno", st.node.lineno)
                at = f"({st.filename.strip('<>')}, line {line})"
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                    if isinstance(node, ast.ImportFrom) and node.level:
                        names = ["." * node.level + (node.module or "")]
                    for name in names:
                        if name == "tinymlp.fast" or name.startswith("tinymlp.fast."):
                            self.problems.append(
                                f"the answer's code imports {name} {at}, the library's fast tier (compiled "
                                "kernels of the same ops): write the computation yourself")
                        elif name.split(".")[0] not in ALLOWED_IMPORTS:
                            self.problems.append(
                                f"the answer's code imports {name} {at}: an answer may import numpy, math, "
                                "tinymlp and the standard helpers (functools, itertools, collections, ...)")
                elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
                    self.problems.append(f"the answer's code uses {node.id} {at}, which {FORBIDDEN_NAMES[node.id]}")
                elif isinstance(node, ast.Attribute) and node.attr == "fast" and _root(node) == "tinymlp":
                    self.problems.append(
                        f"the answer's code uses tinymlp.fast {at}, the library's fast tier (compiled kernels of "
                        "the same ops): write the computation yourself")
                elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
                    self.problems.append(
                        f"the answer's code uses .{node.attr} {at}, which {FORBIDDEN_ATTRIBUTES[node.attr]}")
        self.problems = list(dict.fromkeys(self.problems))
        return self.problems


class Notebook:
    """A submitted notebook: its cells parsed into top-level statements, its student and lesson."""

    def __init__(self, path, label=None):
        self.path = pathlib.Path(path)
        self.raw = json.loads(self.path.read_text(encoding="utf-8"))
        self.label = label or f"{self.path.parent.name}/{self.path.name}"
        self.statements: list[Statement] = []
        self.sources: dict[str, str] = {}
        self.syntax_errors: list[str] = []
        transform = _transformer()
        changes = []
        for n, cell in enumerate(self.raw.get("cells", []), start=1):
            if cell.get("cell_type") != "code":
                continue
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else source
            source = transform(source)
            filename = f"<{self.label}, cell {n}>"
            try:
                tree = ast.parse(source, filename=filename)
            except SyntaxError as err:
                self.syntax_errors.append(f"cell {n}, line {err.lineno}: {err.msg}")
                continue
            self.sources[filename] = source
            for node in tree.body:
                binds, changed = _binds(node)
                self.statements.append(Statement(n, filename, node, binds, _uses(node)))
                changes.append(changed)
        # a method call changes its object in place, unless the object is a module (np.random.seed)
        modules = {a.asname or a.name.split(".")[0] for st in self.statements
                   if isinstance(st.node, (ast.Import, ast.ImportFrom)) for a in st.node.names}
        for st, changed in zip(self.statements, changes):
            st.binds |= changed - modules

    @property
    def metadata(self) -> dict:
        return self.raw.get("metadata", {})

    @property
    def student(self) -> str:
        """The name in the notebook's metadata (``student``, or ``tinymlp.student``), else its folder's."""
        meta = self.metadata
        name = meta.get("student") or meta.get("tinymlp", {}).get("student")
        return str(name) if name else self.path.resolve().parent.name

    @property
    def lesson(self) -> str:
        """The lesson number: the metadata's ``tinymlp.lesson``, else the file name's first two digits."""
        lesson = str(self.metadata.get("tinymlp", {}).get("lesson", ""))
        return lesson if re.fullmatch(r"\d\d", lesson) else self.path.name[:2]

    def checked(self) -> dict:
        """{exercise id: (index of the statement, the answer expression)} for the last check call of each."""
        out = {}
        for i, st in enumerate(self.statements):
            for node in ast.walk(st.node):
                if (isinstance(node, ast.Call) and _called(node.func) == "check" and len(node.args) >= 2
                        and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                        and re.fullmatch(r"\d\d\.\d+", node.args[0].value)):
                    out[node.args[0].value] = (i, node.args[1])
        return out

    def program(self, ex_id, default_answer) -> Program:
        """The statements that define exercise ``ex_id``'s answer, and the answer expression."""
        checked = self.checked()
        if ex_id in checked:
            upto, expr = checked[ex_id]
        else:
            upto, expr = len(self.statements), ast.parse(default_answer, mode="eval").body
        needed = _uses(expr)
        keep = set()
        changed = True
        while changed:
            changed = False
            for i in range(upto - 1, -1, -1):
                if i not in keep and self.statements[i].binds & needed:
                    keep.add(i)
                    needed |= self.statements[i].uses
                    changed = True
        bound = set().union(*(self.statements[i].binds for i in keep)) if keep else set()
        found = all(name in bound or hasattr(builtins, name) for name in _uses(expr))
        program = Program(ex_id, ast.unparse(expr), [self.statements[i] for i in sorted(keep)], self.sources, found)
        program.scan()
        return program


def _called(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _root(node):
    """The name at the root of ``a.b[0].c``, or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _binds(node):
    """(names a top-level statement binds, names it changes in place through a method call).

    Bound: assigned, imported, defined, and the root of an assigned item or attribute
    (``W[0] = ...``, ``model.fc.weight = ...``, ``np.allclose = ...``). Changed in place: the
    object of a statement-level call ``rng.shuffle(a)``, ``params.append(p)``, the first
    argument of ``np.add.at(dW, ...)``, ``setattr(obj, ...)``.
    """
    table = symtable.symtable(ast.unparse(node), "<statement>", "exec")
    names = {s.get_name() for s in table.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    changed = set()
    for n in _walk_outside_functions(node):
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(_root(n))  # W[0] = ..., np.allclose = ...: kept whenever the name is needed
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call):
            call = n.value
            if isinstance(call.func, ast.Attribute):
                changed.add(_root(call.func.value))
                if call.func.attr == "at" and call.args:
                    changed.add(_root(call.args[0]))
            elif isinstance(call.func, ast.Name) and call.func.id in ("setattr", "delattr") and call.args:
                changed.add(_root(call.args[0]))
    return names - {None}, changed - {None}


def _walk_outside_functions(node):
    """Like ast.walk, without entering the bodies of functions, lambdas and classes."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if n is not node and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(n))


def _uses(node) -> set:
    """The module-level names a statement (or an expression) reads, in nested functions too."""
    if isinstance(node, ast.expr):
        node = ast.Expr(node)
    table = symtable.symtable(ast.unparse(node), "<statement>", "exec")
    names = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        names |= {s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()
                  or (child.get_type() == "class" and s.is_referenced() and not s.is_assigned())}
        stack.extend(child.get_children())
    return names


def _transformer():
    """IPython's cell transformer (``%magic`` and ``!cmd`` lines become Python), else a plain one."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        manager = TransformerManager()

        def transform(source):
            try:
                out = manager.transform_cell(source)
            except Exception:  # noqa: BLE001: a cell IPython cannot read is left to ast.parse
                return source
            lead = len(source) - len(source.lstrip("\n"))  # IPython drops leading blank lines:
            return "\n" * (lead - (len(out) - len(out.lstrip("\n")))) + out   # keep the cell's line numbers
        return transform
    except ImportError:
        return lambda source: "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                                        for line in source.splitlines())
