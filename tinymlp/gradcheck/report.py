"""The result of a gradient check: the data it is made of and how it is printed.

``gradcheck`` (in ``tinymlp/gradcheck/method.py``) fills in one ``TensorResult`` per checked tensor
and wraps them in a ``GradcheckReport``; ``str(report)`` is the text described under "Reading a
report" in the docstring of the function ``tinymlp.gradcheck``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HINT_KINDS = (
    "sign", "factor2", "half", "mean_vs_sum", "scale_sqrt_d", "transpose", "broadcast_not_summed",
    "no_gradient", "upstream_ignored", "kink", "partial_branch", "boundary", "nan", "wrong_shape",
    "partial_scale", "wrong_formula", "swapped", "low_precision", "too_few_gradients",
    "ignored_by_forward", "row_constant", "row_terms", "swapped_halves", "wrong_order", "shared_intermediate",
    "row_multiple", "batch_mixed", "factor_of_input", "row_factor", "repeated_index", "precision_loss",
    "wrong_axis", "changed_in_place", "block_constant", "block_multiple", "block_terms", "wrong_extent",
    "summed_over_wrong_axis", "ties", "overflow",
)
"""The values ``TensorResult.hint_kind`` can take (besides None)."""

PROBLEM_KINDS = (
    "nondeterministic", "mutated_input", "downcast", "low_precision", "unpromoted_tensor", "not_restored",
    "no_output", "mutated_upstream", "mutated_saved", "not_repeatable", "stateful", "saved_overwritten",
)
"""Problems with the forward function as a whole, found before any gradient is compared."""

WARNING_KINDS = ("constant_values", "batch_of_one", "integer_values", "float32_backward")
"""Warnings: the check passed or failed on its own terms, but the inputs are too special for a
whole class of bugs to show (all ones, a batch of one, whole numbers), or the layer's float32
backward loses precision that a float64 check cannot see."""


class GradcheckWarning(UserWarning):
    """Issued by a *passing* gradcheck for each of its report's warnings (a failing one raises,
    and its report lists them): the pass holds only for inputs where some bugs cannot show."""


# Statuses of one compared value (see the three-way rule in tinymlp/gradcheck/method.py).
PASS, FAIL, UNVERIFIED, NONDIFF = "PASS", "FAIL", "UNVERIFIED", "NONDIFF"


@dataclass
class ElementCheck:
    """One compared value: an element ``index`` (a tuple) or a random direction ("dir 2")."""

    index: object
    numerical: float
    analytical: float
    abs_err: float
    rel_err: float
    status: str  # "PASS", "FAIL", "UNVERIFIED" or "NONDIFF"

    def where(self, name):
        if isinstance(self.index, str):
            return f"{name} {self.index}"
        return f"{name}[{', '.join(str(int(i)) for i in self.index)}]"


@dataclass
class TensorResult:
    """The verdict on one checked tensor (an input or a parameter)."""

    name: str
    kind: str  # "input" or "param"
    shape: tuple
    dtype: str  # the tensor's own dtype (the check ran on a copy in the check dtype)
    mode: str = "full"
    checked: int = 0
    n_fail: int = 0
    n_unverified: int = 0
    n_nondiff: int = 0
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    verdict: str = "ok"  # "ok", "FAIL", "INCONCLUSIVE" or "NONDIFF"
    hint: str | None = None  # the "likely" line: the bug that usually produces the pattern
    hint_kind: str | None = None  # one of HINT_KINDS, or None
    pattern: str | None = None
    trust: str | None = None
    source: str | None = None  # the Function(s) whose backward computed this gradient (the "from" line)
    error: str | None = None  # an error raised by the engine during this tensor's backward
    n_directions: int = 0  # sampled mode: how many of the checks are directions (random and block)
    n_blocks: int = 0  # sampled mode: how many of those are +-1 directions over blocks of every element
    block_promise: str = ""  # sampled mode: which wrong elements the blocks are sure to catch
    worst: list = field(default_factory=list)  # the worst ElementChecks, worst first
    ties: list = field(default_factory=list)  # groups of tied kink elements moved together (ties.Tie)
    rescaled: tuple | None = None  # (factor, why) when checked at the tensor's values times factor
    numerical: np.ndarray | None = None  # float64, NaN where not checked (sampled mode)
    analytical: np.ndarray | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_elements(self) -> int:
        """How many elements were compared one by one (the other checks are directions)."""
        return self.checked - self.n_directions


class GradcheckReport:
    """What ``gradcheck`` found. ``passed``, ``verdict``, ``per_tensor[name]``, ``summary()``.

    ``problems`` lists (kind, message) pairs about the forward as a whole (kinds in
    ``PROBLEM_KINDS``): a non-deterministic forward, a downcast to float32, a modified input.
    ``warnings`` lists (kind, message) pairs (kinds in ``WARNING_KINDS``) that do not fail the
    check: inputs where whole classes of bugs cannot show, precision a float32 backward loses.
    """

    def __init__(self, title, per_tensor, problems, settings, *, strict=True, strict_kinks=False, warnings=()):
        self.title = title
        self.per_tensor: dict[str, TensorResult] = per_tensor
        self.problems: list[tuple[str, str]] = problems
        self.warnings: list[tuple[str, str]] = list(warnings)
        self.settings = settings
        self.strict = strict
        self.strict_kinks = strict_kinks

    @property
    def verdict(self) -> str:
        """"FAIL", "INCONCLUSIVE" or "PASS" for the whole check."""
        verdicts = [r.verdict for r in self.per_tensor.values()]
        if self.problems or "FAIL" in verdicts or (self.strict_kinks and "NONDIFF" in verdicts):
            return "FAIL"
        if "INCONCLUSIVE" in verdicts:
            return "INCONCLUSIVE"
        return "PASS"

    @property
    def passed(self) -> bool:
        verdict = self.verdict
        return verdict == "PASS" or (verdict == "INCONCLUSIVE" and not self.strict)

    @property
    def max_abs_err(self) -> float:
        return max((r.max_abs_err for r in self.per_tensor.values()), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((r.max_rel_err for r in self.per_tensor.values()), default=0.0)

    @property
    def hint_kinds(self) -> set:
        """Every hint kind and problem kind in the report (handy in tests)."""
        kinds = {r.hint_kind for r in self.per_tensor.values() if r.hint_kind}
        return kinds | {kind for kind, _ in self.problems}

    @property
    def warning_kinds(self) -> set:
        """The kinds of the report's warnings (``WARNING_KINDS``)."""
        return {kind for kind, _ in self.warnings}

    def summary(self) -> str:
        """The report as text (also ``str(report)`` and the message of ``GradcheckError``).

        A header with the settings and any PROBLEM with the forward as a whole; a table with one
        row per checked tensor (elements checked, failing, unverified, largest errors, verdict);
        for each tensor that is not ok, its worst elements and the ``pattern`` / ``likely`` /
        ``from`` / ``trust`` lines; and a ``reproduce:`` line. ``help(tinymlp.gradcheck)``
        explains each part.
        """
        return _format_report(self)

    __str__ = summary

    def __repr__(self):
        n = len(self.per_tensor)
        warned = ""
        if self.warnings:
            warned = f", {len(self.warnings)} warning(s): {', '.join(k for k, _ in self.warnings)} (print it)"
        return f"<GradcheckReport {self.verdict}: {n} tensor(s), max rel err {self.max_rel_err:.1e}{warned}>"


class GradcheckError(AssertionError):
    """Raised by ``gradcheck`` when a gradient is wrong; ``str(err)`` is the full report."""

    def __init__(self, report: GradcheckReport):
        super().__init__(report.summary())
        self.report = report


@dataclass
class Settings:
    mode: str
    dtype: np.dtype  # the check dtype (with dtype=None: the least precise of the checked tensors)
    eps: float
    rtol: float
    atol: float
    noise: float = 0.0  # 10 * machine_eps * sum|g*y| / eps, filled in after the first forward
    seed: int | None = 0
    upstream: str = "random"
    promoted_from: tuple = ()
    deterministic: bool | None = None
    restored: bool | None = None
    call: str = "tinymlp.gradcheck(fn, inputs)"  # the call that repeats the check (the reproduce line)

    @property
    def atol_eff(self):
        return max(self.atol, self.noise)



# ------------------------------------------------------------------------------- the text


def _format_report(report) -> str:
    s = report.settings
    status = {"PASS": "passed", "FAIL": "FAILED", "INCONCLUSIVE": "INCONCLUSIVE"}[report.verdict]
    promoted = f" (inputs were {'/'.join(s.promoted_from)} -> promoted)" if s.promoted_from else ""
    lead = f"tinymlp.gradcheck {status}: {report.title}  "
    lines = [
        f"{lead}[mode={s.mode}  check dtype={s.dtype}{promoted}",
        " " * len(lead) + f" eps={s.eps:.0e}  rtol={s.rtol:.0e}  atol={s.atol:.0e} "
                          f"(noise floor {s.noise:.1e})  seed={s.seed}]",
        f"upstream gradient: {_upstream_text(s.upstream)}      forward deterministic: {_yes(s.deterministic)}"
        f"   inputs restored: {_yes(s.restored)}",
    ]
    if s.dtype is not None and s.dtype.itemsize < 8:
        lines.append(f"warning: check ran in {s.dtype}: differences of ~{s.rtol:.0e} are expected and bugs "
                     "below ~1 % are undetectable; use the default dtype='float64'")
    for kind, message in report.problems:
        lines.append(f"PROBLEM ({kind}): {message}")
    for kind, message in report.warnings:
        lines.append(f"warning ({kind}): {message}")
    lines += ["", *_table(report.per_tensor.values()), ""]
    for r in report.per_tensor.values():
        if r.verdict != "ok":
            lines += _details(r)
        elif r.pattern:
            lines.append(f"note {r.name}: {r.pattern}")
    for r in report.per_tensor.values():
        if r.mode.startswith("sampled") and r.n_directions:
            random = r.n_directions - r.n_blocks
            blocks = ""
            if r.n_blocks:
                blocks = (f"; every element is in one of {r.n_blocks} blocks checked along random +-1 signs: "
                          f"{r.block_promise}")
            lines.append(f"note {r.name}: sampled mode checked {r.n_elements} of {r.size:,} elements and "
                         f"{random} random directions{blocks}; to check every element pass mode='full' "
                         f"({2 * r.size:,} forwards), with wrt=[{r.name!r}] to check only this tensor")
    if report.verdict != "PASS":
        lines.append(f"reproduce: {s.call}")
    return "\n".join(lines).rstrip() + "\n"


def _upstream_text(upstream):
    texts = {"random": "random N(0,1) per output (seeded)",
             "ones": "ones (weak: it hides a backward that ignores grad)"}
    return texts.get(upstream, "given by the caller")


def _yes(flag):
    return {True: "yes", False: "NO", None: "-"}[flag]


def _table(results):
    header = ("tensor", "shape", "checked", "fail", "unverified", "max abs err", "max rel err", "verdict")
    rows = []
    for r in results:
        counts = (str(r.checked), str(r.n_fail), str(r.n_unverified),
                  f"{r.max_abs_err:.1e}", f"{r.max_rel_err:.1e}")
        if not r.checked:  # backward raised, or the forward could not be checked at all
            counts = ("-",) * 5
        if r.checked and r.mode.startswith("sampled") and r.n_directions:
            blocks = f" + {r.n_blocks} blocks" if r.n_blocks else ""
            counts = (f"{r.n_elements} of {r.size} + {r.n_directions - r.n_blocks} dir{blocks}", *counts[1:])
        rows.append((f"{r.kind} {r.name}", str(r.shape).replace(" ", ""), *counts, r.verdict))
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
            for row in [header, *rows]]


def _details(r):
    noun = {"FAIL": "failing checks", "NONDIFF": "elements at a kink",
            "INCONCLUSIVE": "unverified checks"}[r.verdict]
    count = {"FAIL": r.n_fail, "NONDIFF": r.n_nondiff, "INCONCLUSIVE": r.n_unverified}[r.verdict]
    lines = []
    if r.worst:
        split = ""
        if r.n_directions:
            split = f", of {r.n_elements} elements and {r.n_directions} directions"
        lines.append(f"{r.verdict} {r.name} - worst {len(r.worst)} of {count} {noun} ({r.mode} mode{split}):")
        cells = [("index", "numerical", "analytical", "abs err", "rel err")]
        for ch in r.worst:
            index = ch.index if isinstance(ch.index, str) else "[" + ",".join(map(str, ch.index)) + "]"
            cells.append((index, f"{ch.numerical:+.6e}", f"{ch.analytical:+.6e}",
                          f"{ch.abs_err:.2e}", f"{ch.rel_err:.2e}"))
        widths = [max(len(row[k]) for row in cells) for k in range(5)]
        lines += ["  " + "   ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    else:
        lines.append(f"{r.verdict} {r.name}:")
    for label, text in (("pattern", r.pattern), ("likely", r.hint), ("from", r.source), ("trust", r.trust)):
        if text:
            lines.append(f"  {label:<8}: {text}")
    return lines + [""]

