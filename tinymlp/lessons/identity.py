"""Whose notebook, and which lesson: decided by the instructor's files, never by the notebook alone.

The student of a notebook is the folder it was submitted in (``submissions/alice/04.ipynb`` is
alice's), or that folder's name in a roster the instructor passes (``--roster``: lines
``folder,Student Name``). A notebook's metadata may name its student (``"student": "Alice
Martin"``, for uploads in folders named by number), and that name is used only when it is safe
and unique:

* safe: letters, digits, spaces and ``.@'-_``, no path separator, no ``..``, at most 80
  characters (the name becomes a folder under ``-o``);
* unique: no other submission folder claims it, by its name, its roster entry or its metadata.
  A metadata name that collides with another folder's student is refused, the notebook keeps
  its folder's name, and a line names both files: the other student's results are untouched.

Two notebooks of one lesson for one student are refused (not graded), with a line naming both
files. The lesson of a notebook is the one whose exercises it checks (its ``check("04.1", ...)``
calls); the lesson it is graded for is the one its file name says (``04_layernorm.ipynb``), so a
notebook of another lesson handed in under this lesson's name scores 0 with the reason, and
metadata cannot move a notebook to another lesson. Outputs are written only inside ``-o``
(``inside``).
"""

from __future__ import annotations

import pathlib
import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Submission", "assign", "inside", "read_roster", "safe_name"]

SAFE = re.compile(r"^[\w][\w .@'-]{0,79}$")


def safe_name(name) -> bool:
    """A name that can be a folder's: no separators, no ``..``, no control characters."""
    return isinstance(name, str) and bool(SAFE.fullmatch(name)) and ".." not in name and name.strip() == name


def read_roster(path) -> dict:
    """{folder: student} from lines ``folder,Student Name`` (or ``folder`` alone; # comments)."""
    roster = {}
    for n, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        folder, _, name = (part.strip() for part in line.partition(","))
        name = name or folder
        if not safe_name(name):
            raise ValueError(f"{path}, line {n}: {name!r} cannot be a student's name (letters, digits, spaces "
                             "and .@'-_ only, no path separators or '..')")
        if folder in roster:
            raise ValueError(f"{path}, line {n}: folder {folder!r} is listed twice")
        roster[folder] = name
    if len(set(roster.values())) != len(roster):
        twice = [name for name, k in Counter(roster.values()).items() if k > 1]
        raise ValueError(f"{path}: {', '.join(twice)} listed for two folders")
    return roster


def lesson_of_name(path) -> str | None:
    """The lesson a file name says: ``04_layernorm.ipynb`` -> "04"."""
    match = re.match(r"^(\d\d)(?:_|\.|$)", pathlib.Path(path).name)
    return match.group(1) if match else None


@dataclass
class Submission:
    """One notebook to grade: its student, the lesson it is graded for, and what to tell the instructor."""

    path: pathlib.Path
    folder: str
    student: str
    lesson: str | None  # the lesson it is graded for
    checks: str | None = None  # the lesson its check calls name (None: it names none)
    refused: str = ""  # why it is not graded at all
    notes: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.folder}/{self.path.name}"

    @property
    def wrong_lesson(self) -> str:
        """Why the notebook cannot count for its lesson ("" when it can)."""
        if self.checks is None or self.lesson is None or self.checks == self.lesson:
            return ""
        return (f"{self.path.name} is a notebook of lesson {int(self.checks)} (its check calls are lesson "
                f"{int(self.checks)}'s exercises), not of lesson {int(self.lesson)}: it counts for no exercise of "
                f"lesson {int(self.lesson)}")


def _metadata_name(notebook):
    meta = notebook.metadata if isinstance(notebook.metadata, dict) else {}
    name = meta.get("student")
    if name is None and isinstance(meta.get("tinymlp"), dict):
        name = meta["tinymlp"].get("student")
    return name


def _checked_lesson(notebook):
    lessons = [ex.split(".")[0] for ex in notebook.checked_exercises()]
    return Counter(lessons).most_common(1)[0][0] if lessons else None


def assign(notebooks, roster=None) -> list:
    """A ``Submission`` for each ``(path, Notebook)``: students and lessons decided (module docstring)."""
    subs, claim_of = [], {}
    for path, nb in notebooks:
        path = pathlib.Path(path)
        folder = path.resolve().parent.name
        sub = Submission(path, folder, folder, lesson_of_name(path) or _checked_lesson(nb), _checked_lesson(nb))
        if roster is not None:
            if folder not in roster:
                sub.refused = f"{sub.label}: the folder {folder!r} is not in the roster"
            else:
                sub.student = roster[folder]
        claim_of[id(sub)] = _metadata_name(nb) if roster is None else None
        subs.append(sub)
    owners = {}  # student -> the folders whose student it is by name or roster
    for sub in subs:
        owners.setdefault(sub.student, set()).add(sub.folder)
    claims = {}
    for sub in subs:
        claim = claim_of[id(sub)]
        if claim is None or claim == sub.student:
            continue
        if not safe_name(claim):
            sub.notes.append(f"{sub.label}: the name in its metadata ({str(claim)[:40]!r}) cannot be a student's "
                             f"(a path, or characters other than letters, digits, spaces and .@'-_): graded as "
                             f"{sub.student!r}")
            continue
        claims.setdefault(claim, []).append(sub)
    for claim, claimants in claims.items():
        folders = {s.folder for s in claimants}
        others = owners.get(claim, set()) - folders
        if others or len(folders) > 1:
            rivals = [s.label for s in subs if s.folder in others] + [s.label for s in claimants]
            for sub in claimants:
                sub.notes.append(f"{sub.label} claims student {claim!r} in its metadata, as does or is "
                                 f"{' and '.join(r for r in rivals if r != sub.label)}: refused; graded as "
                                 f"{sub.student!r}")
            continue
        for sub in claimants:
            sub.student = claim
    by_key = {}
    for sub in subs:
        if not sub.refused:
            by_key.setdefault((sub.student, sub.lesson), []).append(sub)
    for (student, lesson), same in by_key.items():
        if len(same) > 1:
            names = " and ".join(s.label for s in same)
            for sub in same:
                sub.refused = (f"two notebooks of lesson {lesson} for student {student!r}: {names}; neither is "
                               "graded (hand in one)")
    return subs


def inside(folder, *parts) -> pathlib.Path:
    """``folder/parts...``, refused unless it stays inside ``folder`` (no ``..``, no link out)."""
    base = pathlib.Path(folder).resolve()
    current = base
    for part in pathlib.PurePath(*parts).parts:
        if part in ("..", "") or pathlib.PurePath(part).is_absolute():
            raise ValueError(f"{pathlib.PurePath(*parts)} leaves {folder}: refused")
        current = current / part
        if current.is_symlink():
            raise ValueError(f"{current} is a symbolic link: refused")
    if base not in current.resolve().parents and current.resolve() != base:
        raise ValueError(f"{current} is outside {folder}: refused")
    return current
