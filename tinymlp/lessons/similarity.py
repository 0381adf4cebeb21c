"""Copies flagged for the instructor, with their evidence: each answer compared with every other
student's, with the worked notebook and with the library's code, as MOSS does for programming
classes, after removing what the lesson itself hands out.

What a student wrote for an exercise is what their program for it (``notebook.py``) has that the
student build of the lesson (``lessons/exercises/``) does not: the statements inside the given
functions that differ from the stub's, and the functions they added. Each such part is read two
ways, as sequences of k tokens (k-grams):

* its syntax tree, normalised: docstrings dropped, the function's own variable names replaced by
  v0, v1, ... in order of use, so that renaming, reordering statements and reformatting change
  little ("shape");
* its text: names and comments as written ("text").

The base, as MOSS's base file, is removed from every answer before comparing: the k-grams of
every code cell of the student build (the code the notebook hands out), and, for shapes, the
worked answer's (the lesson's own formula in code: the boxed formula written in any names has
that shape, so a shape shared with it, or by two students through it, is no sign of a copy).
What is left is compared:

* student with student, shape and text: a pair is alike when one of them shares ``PAIR`` of
  what is left of it with the other, and at least ``LEAST`` k-grams in all. Both rows get the
  same flag, naming the other student, the shares both ways and the lines alike; the grader
  cannot know who wrote first, and says no direction;
* a student with the worked notebook and the library's functions, text only (names, comments,
  layout as written): alike when ``KEY`` of the student's text is the worked notebook's, or
  ``LIBRARY`` of one of its functions' text is a library function's. Measured on lesson 4: the
  boxed formula in one's own names shares 39% of its text with the worked notebook, the worked
  answer with four cosmetic edits 72%, the library's backward with its helper inlined 58% with
  the library's; a classmate's answer renamed is alike in 100% of its shape.

A flag is evidence for the instructor, never a failure. The report lists every pair above
``REPORT``, most similar first.
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
from dataclasses import dataclass, field

__all__ = ["Answer", "alike", "base", "compare", "library_answers", "written"]

PAIR, KEY, LIBRARY, REPORT = 0.7, 0.6, 0.5, 0.45  # shares of what is left after the base
K = 4
LEAST = 12  # k-grams in common: fewer is too little to say two answers are alike


@dataclass
class Answer:
    """What one author wrote for one exercise: its shape and text tokens, and each function's."""

    owner: str  # "alice", "the worked notebook (lessons/04_layernorm.ipynb)", "tinymlp/ops/norm.py (normalize)"
    exercise: str
    shape: list = field(default_factory=list)
    text: list = field(default_factory=list)
    student: bool = True
    parts: list = field(default_factory=list)  # one Answer per function written (compared with the library's)
    lines: list = field(default_factory=list)  # per text token: (where, the line as written): "cell 7, line 3"

    def grams(self, which, base=frozenset()):
        tokens = self.shape if which == "shape" else self.text
        return {tuple(tokens[i:i + K]) for i in range(max(len(tokens) - K + 1, 1))} - base if tokens else set()

    def lines_with(self, grams) -> list:
        """The lines where the text k-grams ``grams`` start, in order, each once."""
        found = [self.lines[i] for i in range(len(self.text) - K + 1) if tuple(self.text[i:i + K]) in grams]
        return list(dict.fromkeys(found))


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
    for st in statements:  # the statement as code again, names normalised, comments and layout gone
        tree = Rename().visit(ast.parse(ast.unparse(st)))
        tokens += re.findall(r"\w+|[^\w\s]", ast.unparse(tree))
    return tokens


def _text_tokens(source, statements, label=""):
    """The tokens of the lines ``statements`` span, names and comments as written, and for each
    token its line: ("alice/04.ipynb, cell 7, line 3", the line's text)."""
    if not statements:
        return [], []
    first = statements[0].lineno
    lines = source.splitlines()[first - 1:statements[-1].end_lineno]
    text = "\n".join(line.strip() for line in lines)
    tokens, where = [], []

    def at(row):
        return (f"{label}, line {first + row - 1}", lines[row - 1].strip()[:100])
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text + "\n").readline):
            if tok.type == tokenize.COMMENT:
                words = ["#"] + tok.string.lstrip("#").lower().split()
                tokens += words
                where += [at(tok.start[0])] * len(words)
            elif tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                                  tokenize.ENDMARKER, tokenize.ENCODING):
                tokens.append(tok.string)
                where.append(at(tok.start[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens, where = text.split(), []
        where = [at(1)] * len(tokens)
    return tokens, where


def _statements_of(program):
    return [(st.node, program.sources[st.filename]) for st in program.statements]


def written(owner, exercise, program, skeleton=None, student=True) -> Answer:
    """What ``program`` has that the ``skeleton`` program (the student build's) has not."""
    answer = Answer(owner, exercise, student=student)
    given = _functions(_statements_of(skeleton)) if skeleton is not None else {}
    labels = {program.sources[st.filename]: st.filename.strip("<>") for st in program.statements}
    for name, (fn, source) in _functions(_statements_of(program)).items():
        body = _body(fn)
        stub = given.get(name)
        if stub is not None:
            seen = {ast.dump(s) for s in _body(stub[0])}
            body = [s for s in body if ast.dump(s) not in seen]
        if not body:
            continue
        text, lines = _text_tokens(source, body, labels.get(source, ""))
        part = Answer(f"{owner}'s {name}", exercise, _shape_tokens(fn, body), text, student, lines=lines)
        answer.parts.append(part)
        answer.shape += part.shape
        answer.text += part.text
        answer.lines += part.lines
    return answer


def base(notebook, worked=None) -> dict:
    """What the lesson hands out, as k-grams to remove before comparing: {"shape": ..., "text": ...}
    of every code cell of ``notebook`` (the student build), and the shape of ``worked`` (an Answer:
    the worked notebook's, the lesson's formula in code)."""
    out = {"shape": set(), "text": set()}
    if notebook is not None:
        for source in notebook.sources.values():
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            given = Answer("base", "", text=_text_tokens(source, tree.body)[0] if tree.body else [])
            out["text"] |= given.grams("text")
            for fn, _ in _functions([(node, source) for node in tree.body]).values():
                out["shape"] |= Answer("base", "", shape=_shape_tokens(fn, _body(fn))).grams("shape")
    if worked is not None:
        out["shape"] |= worked.grams("shape")
    return {k: frozenset(v) for k, v in out.items()}


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
                text, lines = _text_tokens(src, body, name)
                out.append(Answer(f"{name} ({qualname})", ex.id, _shape_tokens(fn, body), text, student=False,
                                  lines=lines))
    return out


# ------------------------------------------------------------------------------ comparing
def alike(a, b, base=None, kinds=("shape", "text")):
    """(the share of ``a`` in common with ``b``, the share of ``b`` in common with ``a``, the text
    k-grams in common) for the kind of reading where they are most alike, once the base is removed;
    shares are 0 where fewer than ``LEAST`` k-grams are in common."""
    base = base or {}
    best = (0.0, 0.0, set())
    for which in kinds:
        ga, gb = a.grams(which, base.get(which, frozenset())), b.grams(which, base.get(which, frozenset()))
        common = ga & gb
        if len(common) < LEAST:
            continue
        shares = (len(common) / len(ga), len(common) / len(gb))
        if max(shares) > max(best[:2]):
            best = (*shares, a.grams("text", base.get("text", frozenset())) & b.grams("text", base.get("text",
                                                                                                       frozenset())))
    return best


def _evidence(a, b, common):
    lines_a, lines_b = a.lines_with(common), b.lines_with(common)
    if not lines_a:
        return "the same statements in the same structure, names changed"
    shown = "; ".join(f"{where}: {text}" for where, text in lines_a[:3]) + ("; ..." if len(lines_a) > 3 else "")
    other = f" (and {lines_b[0][0]}{' ...' if len(lines_b) > 1 else ''})" if lines_b else ""
    return f"lines alike: {shown}{other}"


def compare(answers, worked=None, library=None, bases=None):
    """Flags for each student answer (with their evidence), and the report lines.

    ``answers``: the students' Answers; ``worked``: {exercise: the worked notebook's Answer};
    ``library``: {exercise: [Answers of library functions]}; ``bases``: {exercise: ``base(...)``}.
    Returns ({(owner, exercise): [flag]}, [report line]).
    """
    worked, library, bases = worked or {}, library or {}, bases or {}
    flags, pairs = {}, []
    by_exercise = {}
    for a in answers:
        by_exercise.setdefault(a.exercise, []).append(a)
    for ex_id, group in sorted(by_exercise.items()):
        given = bases.get(ex_id, {})
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                share_a, share_b, common = alike(a, b, given)
                score = max(share_a, share_b)
                if score >= REPORT:
                    pairs.append((score, ex_id, f"{a.owner} ({share_a:.0%} of it) and {b.owner} ({share_b:.0%})"))
                if score >= PAIR:
                    said = (f"alike with student {{}}'s answer ({share_a:.0%} of this one, {share_b:.0%} of theirs, "
                            f"after the code the lesson hands out; which came first the grader cannot tell): "
                            f"{_evidence(a, b, common)}")
                    flags.setdefault((a.owner, ex_id), []).append(said.format(b.owner))
                    said_b = said.replace(f"({share_a:.0%} of this one, {share_b:.0%} of theirs",
                                          f"({share_b:.0%} of this one, {share_a:.0%} of theirs")
                    flags.setdefault((b.owner, ex_id), []).append(said_b.format(a.owner).replace(
                        _evidence(a, b, common), _evidence(b, a, common)))
            sources = ([worked[ex_id]] if ex_id in worked else []) + library.get(ex_id, [])
            for b in sources:
                parts = [a] if b in worked.values() else a.parts
                scored = [(alike(part, b, given, kinds=("text",)), part) for part in parts]
                if not scored:
                    continue
                (share, _, common), part = max(scored, key=lambda item: item[0][0])
                if share >= REPORT:
                    pairs.append((share, ex_id, f"{a.owner} ({share:.0%} of it) and {b.owner}"))
                if share >= (KEY if b in worked.values() else LIBRARY):
                    flags.setdefault((a.owner, ex_id), []).append(
                        f"alike with {b.owner} ({share:.0%} of this answer's text, after the code the lesson hands "
                        f"out): {_evidence(part, b, common)}")
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    lines = [f"{score:4.0%}  {ex_id}  {who}" for score, ex_id, who in pairs]
    return flags, lines
