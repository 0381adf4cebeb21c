"""The exercises of the course: what each one asks, where it is taught, how it is checked.

An exercise is a check function registered with ``@exercise``::

    @exercise("04.1", "LayerNorm backward", answer="MyLayerNorm", reference="tinymlp/ops/norm.py (LayerNorm)",
              forbidden=("tinymlp.ops.norm.LayerNorm",), derived=True, cost=layer_norm_cost)
    def layer_norm(cls, case):
        shape = case.pick((2, 3, 8), (3, 2, 5))      # the public case's shape, a hidden case's
        x = t64(case.rng.normal(size=shape))
        ...

The check receives the student's answer and a ``Case``: the public case (the exercise's own
seed and shapes, the same every time: what a notebook's ``check`` runs) or a hidden one (a
seed of the grader's and other shapes, which the notebook never saw). It raises ``Wrong`` (or
``GradcheckError``) when the answer is wrong and returns when it is right. The checks live in
``tinymlp/lessons/checks/``, one file per lesson.

Where the lesson teaches the exercise (``Exercise.section``, the ``see:`` line of a failing check)
is not written here: ``lessons/make_lessons.py`` reads it from the notebook's own headings above
the exercise's answer into ``sections.py``.

``forbidden`` names the library code that implements the same thing: it is unavailable to the
answer (``forbidden.py``). ``derived``: the exercise asks for a derivative worked out by hand, so
the answer may not compute with complex numbers (a complex step) and is flagged when it
defines its own number type (dual numbers). ``cost(rng)`` gives a ``CostCase`` for a Function
answer: inputs large enough that a gradient estimated element by element takes hundreds of
forwards where a derived one takes a few (``cost.py``). ``answer`` is the name the notebook
gives the answer, for a notebook whose ``check`` call was deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EXERCISES", "Case", "CostCase", "Exercise", "Wrong", "exercise"]


class Wrong(Exception):
    """An answer that disagrees with the reference; the message says how."""


@dataclass(frozen=True)
class CostCase:
    """Inputs for timing a Function answer: ``reference(*inputs)`` is a plain NumPy forward of the
    same op, the yardstick; ``needs`` says which inputs require a gradient."""

    inputs: tuple
    needs: tuple
    reference: object
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    id: str
    title: str
    run: object  # run(answer, case): raises Wrong / GradcheckError when the answer is wrong
    answer: str  # the name the lesson gives the answer (MyLayerNorm, neuron_gradient, ...)
    reference: str  # the file of tinymlp that does the same: "tinymlp/ops/norm.py (LayerNorm)"
    forbidden: tuple = ()  # dotted names of that code: unavailable to the answer
    seed: int = 0  # the public case's seed
    derived: bool = False  # the answer is a derivative worked out by hand
    cost: object = None  # cost(rng) -> CostCase, for a Function answer

    @property
    def lesson(self) -> str:
        return self.id.split(".")[0]

    @property
    def headings(self) -> tuple:
        """The notebook's headings above the exercise's answer: ("1. Softmax", "The Jacobian")."""
        from .sections import SECTIONS

        return SECTIONS.get(self.id, ())

    @property
    def section(self) -> str:
        """Where the lesson teaches it: 'lesson 5, section "1. Softmax" > "The Jacobian"'."""
        where = " > ".join(f'"{h}"' for h in self.headings)
        return f"lesson {int(self.lesson)}" + (f", section {where}" if where else "")


EXERCISES: dict[str, Exercise] = {}


def exercise(ex_id, title, *, answer, reference, forbidden=(), seed=0, derived=False, cost=None):
    """Register a check function as the check of exercise ``ex_id``."""
    def register(fn):
        EXERCISES[ex_id] = Exercise(ex_id, title, fn, answer, reference, tuple(forbidden), seed, derived, cost)
        return fn
    return register


@dataclass
class Case:
    """The inputs of one run of a check: public (the exercise's seed) or hidden (the grader's).

    ``rng`` draws every value; ``pick(public, hidden)`` chooses shapes and sizes, so that a
    hidden case also catches an answer that hard-codes the public case's shapes.
    """

    seed: int
    hidden: bool = False
    rng: np.random.Generator = field(init=False, repr=False)
    call: str = ""  # the arguments that repeat this case: '"04.1", MyLayerNorm, seed=123' (reproduce lines)
    capture: int | None = None  # tinymlp.lessons.case: stop at this gradcheck and hand back its (fn, inputs)
    gradchecks: int = 0  # how many gradchecks this run has made so far
    backwards: object = None  # backwards(): names of the answer's own Functions whose backward has run

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def pick(self, public, hidden):
        """``public`` in the public case, ``hidden`` in a hidden one."""
        return hidden if self.hidden else public
