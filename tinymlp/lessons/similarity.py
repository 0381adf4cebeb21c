"""Copies flagged for the instructor: each answer compared with the worked notebook, the library's
code and every other student's answer in the batch, as MOSS does for programming classes.

What a student wrote for an exercise is what their program for it (``notebook.py``) has that the
student build of the lesson (``lessons/exercises/``) does not: the statements inside the given
functions that differ from the stub's, and the functions they added. Each such part is read two
ways:

* its syntax tree, normalised: docstrings dropped, the function's own variable names replaced by
  v0, v1, ... in order of use (attributes, globals and constants kept), so that renaming or
  reformatting changes nothing;
* its text: names and comments as written (a comment copied with the code is a strong sign).

Two answers are compared by the share of their k-token sequences they have in common (Jaccard),
on the tree and on the text; an answer is "the same as" another when either share is at least
``SAME`` (0.95) and the part is large enough to say so (a one-line formula is written alike by
many students who derived it). The worked notebook's answer (``lessons/NN_name.ipynb``) and each
function of the library files the exercise names (its reference and its forbidden code) are
compared the same way. The result is a flag in the row ("same as the worked notebook", "same as
tinymlp/ops/norm.py (LayerNorm.backward)", "same as student bob") and a report of every pair
above ``REPORT`` (0.6), most similar first. A flag is not a failure: the instructor decides.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
from dataclasses import dataclass, field

__all__ = ["Answer", "compare", "library_answers", "written"]

SAME, REPORT = 0.95, 0.6
K = 4
MIN_SHAPE, MIN_TEXT = 40, 20  # tokens: smaller parts are not flagged


@dataclass
class Answer:
    """What one author wrote for one exercise: its shape and text tokens, and each function's."""

    owner: str  # "alice", "the worked notebook (lessons/04_layernorm.ipynb)", "tinymlp/ops/norm.py (normalize)"
    exercise: str
    shape: list = field(default_factory=list)
    text: list = field(default_factory=list)
    student: bool = True
    parts: list = field(default_factory=list)  # one Answer per function written (compared with the library's)

    def grams(self, which):
        tokens = self.shape if which == "shape" else self.text
        return {tuple(tokens[i:i + K]) for i in range(max(len(tokens) - K + 1, 1))} if tokens else set()


# ------------------------------------------------------------------------------ reading code
def _functions(statements):
    """{qualified name: (FunctionDef, the cell's source)} for every function in the statements."""
    out = {}

    def visit(node, prefix, source):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = (child, source)
                visit(child, prefix + child.name + ".", source)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", source)

    for node, source in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = (node, source)
            visit(node, node.name + ".", source)
        elif isinstance(node, ast.ClassDef):
            visit(node, node.name + ".", source)
    return out


def _body(fn):
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _shape_tokens(fn, statements):
    """The normalised syntax of ``statements`` (of function ``fn``), as tokens."""
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = {}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in local:
                return ast.copy_location(ast.Name(names.setdefault(node.id, f"v{len(names)}"), node.ctx), node)
            return node

    tokens = []
    for st in statements:
        tree = Rename().visit(ast.parse(ast.unparse(st)))
        tokens += re.findall(r"\w+|[^\w\s]", ast.dump(tree, annotate_fields=False))
    return tokens


def _text_tokens(source, statements):
    """The tokens of the lines ``statements`` span, names and comments as written."""
    if not statements:
        return []
    lines = source.splitlines()[statements[0].lineno - 1:statements[-1].end_lineno]
    text = "\n".join(line.strip() for line in lines)
    tokens = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text + "\n").readline):
            if tok.type == tokenize.COMMENT:
                tokens += ["#"] + tok.string.lstrip("#").lower().split()
            elif tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                                  tokenize.ENDMARKER, tokenize.ENCODING):
                tokens.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = text.split()
    return tokens


def _statements_of(program):
    return [(st.node, program.sources[st.filename]) for st in program.statements]


def written(owner, exercise, program, skeleton=None, student=True) -> Answer:
    """What ``program`` has that the ``skeleton`` program (the student build's) has not."""
    answer = Answer(owner, exercise, student=student)
    given = _functions(_statements_of(skeleton)) if skeleton is not None else {}
    for name, (fn, source) in _functions(_statements_of(program)).items():
        body = _body(fn)
        stub = given.get(name)
        if stub is not None:
            seen = {ast.dump(s) for s in _body(stub[0])}
            body = [s for s in body if ast.dump(s) not in seen]
        if not body:
            continue
        part = Answer(f"{owner}'s {name}", exercise, _shape_tokens(fn, body), _text_tokens(source, body), student)
        answer.parts.append(part)
        answer.shape += part.shape
        answer.text += part.text
    return answer


def library_answers(ex, root) -> list:
    """One Answer per function of the library files exercise ``ex`` names (its reference, and the
    files of its forbidden code)."""
    from .forbidden import resolve, where

    files = {ex.reference.split(" ")[0]}
    for dotted in ex.forbidden:
        try:
            files.add(where(resolve(dotted)))
        except (ImportError, AttributeError):
            continue
    out = []
    for name in sorted(files):
        path = pathlib.Path(root) / name
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        for qualname, (fn, src) in _functions([(node, source) for node in tree.body]).items():
            body = _body(fn)
            if body:
                out.append(Answer(f"{name} ({qualname})", ex.id, _shape_tokens(fn, body), _text_tokens(src, body),
                                  student=False))
    return out


# ------------------------------------------------------------------------------ comparing
def similarity(a, b) -> float:
    """The larger of the shape and text shares of k-token sequences in common, each counted only
    for parts large enough (0 when neither is)."""
    best = 0.0
    for which, least in (("shape", MIN_SHAPE), ("text", MIN_TEXT)):
        tokens_a, tokens_b = (a.shape, b.shape) if which == "shape" else (a.text, b.text)
        if min(len(tokens_a), len(tokens_b)) < least:
            continue
        ga, gb = a.grams(which), b.grams(which)
        best = max(best, len(ga & gb) / len(ga | gb))
    return best


def compare(answers, worked=None, library=None):
    """Flags for each student answer, and the report lines.

    ``answers``: the students' Answers; ``worked``: {exercise: the worked notebook's Answer};
    ``library``: {exercise: [Answers of library functions]}. Returns ({(owner, exercise): [flag]},
    [report line]).
    """
    worked, library = worked or {}, library or {}
    flags, pairs = {}, []
    by_exercise = {}
    for a in answers:
        by_exercise.setdefault(a.exercise, []).append(a)
    for ex_id, group in sorted(by_exercise.items()):
        others = [worked[ex_id]] if ex_id in worked else []
        for i, a in enumerate(group):
            for b in group[i + 1:] + others + library.get(ex_id, []):
                score = similarity(a, b) if b.student or b in others else max(
                    [similarity(part, b) for part in a.parts] or [0.0])
                if score >= REPORT:
                    pairs.append((score, ex_id, a.owner, b.owner if not b.student else f"student {b.owner}"))
                if score >= SAME:
                    label = b.owner if not b.student else f"student {b.owner}"
                    flags.setdefault((a.owner, ex_id), []).append(f"same as {label} ({score:.0%} alike)")
                    if b.student:
                        flags.setdefault((b.owner, ex_id), []).append(f"same as student {a.owner} ({score:.0%} alike)")
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    lines = [f"{score:4.0%}  {ex_id}  {who}  ~  {other}" for score, ex_id, who, other in pairs]
    return flags, lines
