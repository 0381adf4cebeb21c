"""An exercise's answer, read from a notebook's code: the program that defines it, and nothing else.

The grader does not take answers from the notebook's kernel (whatever ran there could have
changed them, or the checker) nor from its printed output. It reads the notebook's code cells
and, for each exercise, keeps the statements its answer needs:

1. the answer is the second argument of the last ``check("04.1", ...)`` call in the notebook
   (or, if the student deleted that line, the name the lesson gives it, ``MyLayerNorm``);
2. going back from that call, every top-level statement that binds (or changes, such as
   ``W[0] = ...``, ``rng.shuffle(a)`` or ``fill(a)``) a name the answer uses is kept, then the
   names those statements use, until nothing is added: imports, helper functions, constants;
3. the kept statements are compiled, in the answer's own process, with the notebook's name,
   cell number and line numbers, so that an error inside the answer points at the student's
   own line (``Program.job``).

``scan.py`` then refuses what an answer never needs and what the grader could not follow
(code built at run time, statements whose effect on the answer it cannot place).
"""

from __future__ import annotations

import ast
import builtins
import json
import pathlib
import re
import symtable
from dataclasses import dataclass, field

__all__ = ["Notebook", "Program", "Statement"]

PLAIN_CALLS = {"print", "check", "skipped", "display", "len", "repr", "str", "type", "isinstance", "help"}
"""Functions whose call as a statement changes none of its arguments."""


@dataclass
class Statement:
    """One top-level statement of a code cell."""

    cell: int  # 1-based, counting every cell (markdown too) from the top of the notebook
    filename: str  # what tracebacks show: "<alice/04_layernorm.ipynb, cell 14>"
    index: int  # its place in the cell's top-level statements
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
    before: list = field(default_factory=list)  # every top-level statement before the check call

    def job(self, ex, label) -> dict:
        """What the answer's process needs (``worker.py``): the cells of the kept statements,
        which statements, the answer's expression, the exercise and its forbidden code."""
        cells = {st.filename for st in self.statements}
        return {"exercise": ex.id, "forbidden": list(ex.forbidden), "derived": ex.derived, "label": label,
                "answer": self.answer,
                "cells": {name: self.sources[name] for name in cells},
                "statements": [[st.filename, st.index] for st in self.statements]}


class Notebook:
    """A submitted notebook: its code cells parsed into top-level statements (``label`` names it
    in the statements' file names: ``<alice/04_layernorm.ipynb, cell 14>``)."""

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
            for index, node in enumerate(tree.body):
                binds, changed = _binds(node)
                self.statements.append(Statement(n, filename, index, node, binds, _uses(node)))
                changes.append(changed)
        # a method call changes its object in place, unless the object is a module (np.random.seed)
        modules = {a.asname or a.name.split(".")[0] for st in self.statements
                   if isinstance(st.node, (ast.Import, ast.ImportFrom)) for a in st.node.names}
        for st, changed in zip(self.statements, changes):
            st.binds |= changed - modules

    @property
    def metadata(self) -> dict:
        return self.raw.get("metadata", {})

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
        return Program(ex_id, ast.unparse(expr), [self.statements[i] for i in sorted(keep)], self.sources, found,
                       self.statements[:upto])

    def checked_exercises(self) -> list:
        """The exercise ids the notebook's ``check`` calls name, in order."""
        return list(self.checked())


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
    """(names a top-level statement binds, names it changes in place through a call).

    Bound: assigned, imported, defined, and the root of an assigned item or attribute
    (``W[0] = ...``, ``model.fc.weight = ...``, ``np.allclose = ...``). Changed in place: the
    object of a statement-level call ``rng.shuffle(a)``, ``params.append(p)``, the first
    argument of ``np.add.at(dW, ...)``, ``setattr(obj, ...)``, the arguments of a function
    called as a statement (``fill(a)``), except ``print``, ``check`` and the like.
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
            elif isinstance(call.func, ast.Name) and call.func.id not in PLAIN_CALLS:
                changed |= {_root(a) for a in call.args}  # fill(a), exec(src, scope): may change a, scope
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
            except Exception:  # noqa: BLE001 (a cell IPython cannot read is left to ast.parse)
                return source
            lead = len(source) - len(source.lstrip("\n"))  # IPython drops leading blank lines:
            return "\n" * (lead - (len(out) - len(out.lstrip("\n")))) + out   # keep the cell's line numbers
        return transform
    except ImportError:
        return lambda source: "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                                        for line in source.splitlines())
