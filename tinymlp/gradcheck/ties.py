"""Kinks, and ties among them: when a failing element is not a backward bug, and when it still is.

``kinks``: an element whose two one-sided slopes differ (and bracket backward's value) sits within
eps of a point where forward is not differentiable (ReLU at 0, |x| at 0, a max with a tie): its
central difference averages two slopes, so its failure is not a backward bug by itself (NONDIFF).

``ties``: a max, a sort or a top-k is not differentiable where elements tie, but it is along the
direction that moves the tied elements *together* (the max of a tie moves with them). Tied
elements see the same one-sided slopes (moving either one changes the same maximum), so kink
elements with equal values and equal slopes are grouped, each group is moved together, and where
that direction is smooth backward's sum over the group must equal the derivative along it. A
max-pool that sends the gradient to every tied maximum counts it twice there: a backward bug;
one that sends it to one maximum (or splits it) agrees, and its kinks stay NONDIFF.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..grad_mode import no_grad
from ..backend import to_device
from .plan import host
from .report import FAIL, NONDIFF

MAX_TIED = 64  # tied groups moved together, per tensor


@dataclass
class Tie:
    """One group of tied kink elements moved together: where, the value, and both derivatives."""

    positions: list  # flat indices into the tensor
    value: float
    numerical: float  # (L(x + h 1_S) - L(x - h 1_S)) / 2h
    analytical: float  # the sum of backward's gradient over the group
    status: str  # "PASS", "FAIL" or "UNVERIFIED"


def kinks(a, n, d_plus, d_minus, status, settings):
    """Failing elements whose one-sided slopes disagree and bracket a: a kink within +-eps."""
    atol = settings.atol_eff
    with np.errstate(invalid="ignore"):
        gap = np.abs(d_plus - d_minus)
        lo, hi = np.minimum(d_plus, d_minus), np.maximum(d_plus, d_minus)
        band = atol + settings.rtol * np.maximum(np.abs(d_plus), np.abs(d_minus))
        kink = (gap > _gap_allowed(n, atol)) & (a >= lo - band) & (a <= hi + band)
    return (status == FAIL) & kink & np.isfinite(a) & np.isfinite(gap)


def _gap_allowed(n, atol):
    return 1e-3 * np.maximum(1.0, np.abs(n)) + 2 * atol


def _close(p, q):
    return abs(p - q) <= 1e-6 * max(abs(p), abs(q)) + 1e-12


def _groups(values, d_plus, d_minus, h):
    """Positions (into the given arrays) of kink elements with equal values (within the step) and
    equal one-sided slopes: the candidate ties, at least two elements each."""
    order = np.argsort(values, kind="stable")
    runs, current = [], [int(order[0])]
    for prev, k in zip(order[:-1], order[1:]):
        if abs(values[k] - values[prev]) <= 2 * h * max(1.0, abs(values[k])):
            current.append(int(k))
        else:
            runs.append(current)
            current = [int(k)]
    runs.append(current)
    found = []
    for run in runs:
        sets = []
        for k in run:
            home = next((s for s in sets if _close(d_plus[s[0]], d_plus[k]) and _close(d_minus[s[0]], d_minus[k])),
                        None)
            if home is None:
                sets.append([k])
            else:
                home.append(k)
        found += [s for s in sets if len(s) >= 2]
    return found[:MAX_TIED]


def ties(run, c, index, a, d_plus, d_minus, status, classify):
    """Move each group of tied kink elements together; a group where that direction is smooth
    and backward's sum disagrees becomes FAIL. Returns (status, [Tie, ...])."""
    kink = np.flatnonzero(status == NONDIFF)
    if len(kink) < 2:
        return status, []
    s = run.settings
    values = host(c.tensor.data.reshape(-1))[index[kink]]
    groups = _groups(values, d_plus[kink], d_minus[kink], s.eps)
    if len(groups) > 1:  # all groups at once first: where each is handled right, two forwards say so
        both = _moved(run, c, index[kink[sum(groups, [])]], a[kink[sum(groups, [])]], classify)
        if both is not None and both[2] != FAIL:
            return status, [Tie([int(i) for i in index[kink[g]]], float(values[g[0]]), *both) for g in groups]
    found = []
    for group in groups:
        one = _moved(run, c, index[kink[group]], a[kink[group]], classify)
        if one is None:
            continue  # still a kink when moved together: not a tie (a ReLU at 0, twice)
        found.append(Tie([int(i) for i in index[kink[group]]], float(values[group[0]]), *one))
        if one[2] == FAIL:
            status = status.copy()
            status[kink[group]] = FAIL
    return status, found


def _moved(run, c, where, a, classify):
    """(numerical, analytical, status) along the direction that moves the elements at ``where``
    together by the step; None where that direction is not smooth either."""
    s, h = run.settings, run.settings.eps
    flat = c.tensor.data.reshape(-1)
    base = host(flat)[where]
    up, down = (base + h).astype(base.dtype), (base - h).astype(base.dtype)
    at = to_device(where, c.tensor.device) if c.tensor.device != "cpu" else where
    with no_grad():
        try:
            flat[at] = to_device(up, c.tensor.device)
            Lp = float(run.ev.loss())
            flat[at] = to_device(down, c.tensor.device)
            Lm = float(run.ev.loss())
        finally:
            flat[at] = to_device(base, c.tensor.device)
    step = up.astype(np.float64) - down.astype(np.float64)
    numerical, analytical = (Lp - Lm) / (2 * h), float((a * step).sum()) / (2 * h)
    if abs((Lp - run.L0) - (run.L0 - Lm)) / (step / 2).mean() > _gap_allowed(numerical, s.atol_eff):
        return None
    return numerical, analytical, str(classify(np.array([analytical]), np.array([numerical]), s.rtol, s.atol_eff)[0][0])


def describe(c, found):
    """Set aside for the report: (pattern, hint) for failing ties, or a note for agreeing ones."""
    shape = c.tensor.shape
    bad = [t for t in found if t.status == FAIL]
    name = c.name

    def where(t):
        cells = [f"{name}[{', '.join(map(str, np.unravel_index(i, shape)))}]" for i in t.positions[:3]]
        return " = ".join(cells) + (" = ..." if len(t.positions) > 3 else "") + f" = {t.value:.3g}"

    listed = "; ".join(where(t) for t in (bad or found)[:2]) + ("; ..." if len(bad or found) > 2 else "")
    if not bad:
        return None, (f"{len(found)} tied group(s) ({listed}) sit at a kink one by one, and moved together they "
                      "agree with backward: ties are handled consistently")
    ratios = np.array([t.analytical / t.numerical for t in bad if t.numerical != 0])
    sizes = sorted({len(t.positions) for t in bad})
    pattern = (f"{len(bad)} of {len(found)} tied group(s) ({listed}) sit at a kink one by one, but moved together "
               "they are smooth (equal one-sided slopes), and there backward's sum over the group differs from the "
               "numerical derivative")
    same = len(ratios) == len(bad) and np.ptp(ratios) <= 1e-3 * np.abs(ratios).max()
    if same:
        pattern += f": backward / numerical = {ratios[0]:.4g} on every group"
    if same and len(sizes) == 1 and abs(ratios[0] - sizes[0]) <= 1e-3 * sizes[0]:
        times = "twice" if sizes[0] == 2 else f"{sizes[0]} times"
        hint = (f"ties sent to every maximum: where {sizes[0]} elements tie (a max, a max-pool, a sort), backward "
                f"gives each of them the whole gradient, so a tie counts it {times}; send it to one of them "
                "(the argmax, as forward picks one) or split it evenly among them")
    else:
        hint = ("backward's gradients over tied elements do not add up to the derivative along the tie (moving them "
                "together): where elements tie, the gradient must be shared among them so that it sums to the "
                "gradient one of them would get alone")
    return pattern, hint
