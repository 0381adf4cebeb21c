"""Grade one exercise of one notebook in a fresh process: ``python -m tinymlp.lessons.worker``.

The grader starts one worker per exercise and submission, so that nothing an answer does
(patching the checker, exiting, looping forever) reaches another answer or the grader. The
worker reads its job as one JSON line on stdin::

    {"notebook": "submissions/alice/04_layernorm.ipynb", "label": "alice/04_layernorm.ipynb",
     "exercise": "04.1", "seeds": [null, 73], "fd": 5, "nonce": "..."}

then, before any of the student's code runs: imports tinymlp and the checks, reads the answer's
program from the notebook (``notebook.py``), refuses what ``Program.scan`` refuses, and takes a
``Snapshot`` of the checker's modules. It runs the program, runs the check on the answer (the
public case and the hidden ones, under a ``Guard``), compares the snapshot, and writes one JSON
line, ``nonce`` first, to file descriptor ``fd``. What the answer prints goes to stdout, which
the grader ignores.
"""

from __future__ import annotations

import builtins
import json
import os
import sys


def main() -> int:
    job = json.loads(sys.stdin.readline())
    fd, nonce = int(job.pop("fd")), job.pop("nonce")
    result = grade(**job)
    os.write(fd, (json.dumps({"nonce": nonce, **result}) + "\n").encode())
    os.close(fd)
    return 0


def grade(notebook, label, exercise, seeds) -> dict:
    """The result of one exercise, as the dict the grader reads."""
    from . import EXERCISES, FAILED, NOT_DONE, run_check
    from .guard import Snapshot
    from .notebook import Notebook
    from .runner import describe_error, reason_of

    import tinymlp.data.tokenizer  # noqa: F401 (every module a check uses is loaded before the snapshot)

    ex = EXERCISES[exercise]

    def failed(details, answer=""):
        return {"status": FAILED, "details": details, "reason": reason_of(details), "reproduce": "", "answer": answer}

    nb = Notebook(notebook, label)
    program = nb.program(exercise, ex.answer)
    if not program.found:
        details = (f"the notebook defines no {program.answer} (the answer to exercise {exercise})"
                   + (f"; cells with a syntax error: {'; '.join(nb.syntax_errors)}" if nb.syntax_errors else ""))
        return {"status": NOT_DONE, "details": details, "reason": details, "reproduce": "", "answer": program.answer}
    if program.problems:
        return failed("\n".join(program.problems), program.answer)

    sys.modules.setdefault("checks", sys.modules["tinymlp.lessons"])  # old notebooks: from checks import check
    snapshot = Snapshot()
    import linecache

    for filename, source in program.sources.items():
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        for st in program.statements:
            import ast

            code = compile(ast.Module(body=[st.node], type_ignores=[]), st.filename, "exec")
            exec(code, namespace)  # noqa: S102: the student's own code, in a process of its own
        answer = eval(compile(program.answer, f"<{label}, the check call>", "eval"), namespace)  # noqa: S307
    except (Exception, SystemExit) as err:  # noqa: BLE001: whatever the student's code raises is the result
        result = failed("the code that defines the answer raised " + describe_error(err), program.answer)
    else:
        checked = run_check(exercise, answer, seeds=tuple(seeds), answer_text=program.answer)
        result = {"status": checked.status, "details": checked.details, "reason": checked.reason,
                  "reproduce": checked.reproduce, "answer": program.answer, "seed": checked.seed,
                  "needs": checked.needs}
    changes = snapshot.changes()
    if changes:
        result = failed("the answer's code changed the checker, so its result cannot be trusted: "
                        + "; ".join(changes[:5]) + (" ..." if len(changes) > 5 else ""), program.answer)
    return result


if __name__ == "__main__":
    sys.exit(main())
