"""Lines of the code that holds workers together, at two revisions (docs/workers.md).

    python scripts/coordination_lines.py [BEFORE [AFTER]]   (git revisions, `.` for the work tree;
default 53d900f HEAD)

Counted: the teacher's agreement, locks and leases, retries and stale-trial recovery, the
worker's wait for other workers; every line of code, not blank lines, comments or docstrings.
Not counted at either revision: opening a storage, interrupt handling, the teacher's training
and loading.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHOLE = None  # every top-level statement of the module
# (module, names or WHOLE) at each revision.
BEFORE = {
    "tuner/teacher.py": [
        "RunTrial",
        "ensure_trained",
        "_teacher_trials",
        "_failed_as_stale",
        "_claim",
        "_skip_duplicate",
        "_finish_duplicate",
        "mark_duplicate",
        "_forget",
    ],
    "tuner/retime.py": ["_CLAIM_PREFIX", "_CLAIM_REFRESH", "_CLAIM_EXPIRES", "front_lock"]
    + ["_now", "_first_claim"],
    "tuner/storage.py": ["RetryingStorage", "_forward", "<loop>", "live_trial_numbers"],
    "tuner/retries.py": WHOLE,
    "tuner/recovery.py": ["requeue", "StaleTrials"],
    "tuner/study.py": ["_run_to_budget", "_claimed_trial_runner", "_nothing_left"]
    + ["_refuse_parallel_sqlite"],
    "tuner/trial.py": ["Objective._stored_teacher"],
    "tuner/optuna_compat.py": ["beat_once", "stale_trial_ids"],
}
AFTER = {
    "tuner/study/teacher_trial.py": WHOLE,
    "tuner/store/lease.py": WHOLE,
    "tuner/store/storage.py": ["RetryingStorage", "_retried", "_once", "_safe_to_repeat", "<loop>"]
    + ["beat_for_unbeaten"],
    # All of it but the message it prints (which was the console's before).
    "tuner/store/retries.py": ["T", "RETRY_SECONDS", "is_transient", "call_with_retries"]
    + ["RetryingProxy"],
    "tuner/store/requeue.py": ["requeue", "died"],
    "tuner/study/stale_trials.py": ["StaleTrials", "requeue_orphans"],
    "tuner/study/worker_loop.py": WHOLE,
    "tuner/study/opening.py": ["_hold_sqlite_study"],
    "tuner/trial/model_training.py": ["stored_teacher_to_load"],
    "tuner/trial/teacher.py": [
        "TeacherMissing",
        "TeacherUnreachable",
        "FETCH_SECONDS",
        "_downloaded",
    ]
    + ["_root_visible"],
    "tuner/store/optuna_compat.py": ["stale_trial_ids", "unbeaten_trial_ids"]
    + ["SingleAttemptRDBStorage"],
}


def _code_lines(source: str) -> set[int]:
    """Line numbers that hold code: not blank, not only a comment, not a docstring."""
    tree = ast.parse(source)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            continue
        if token.type in (tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def _name_of(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.For):
        return "<loop>"
    return None


def _spans(source: str, names: list[str] | None) -> list[tuple[int, int]]:
    tree = ast.parse(source)
    if names is None:
        return [(1, len(source.splitlines()))]
    spans, found = [], set()
    for node in tree.body:
        candidates = [(node, _name_of(node))]
        if isinstance(node, ast.ClassDef):
            candidates += [(child, f"{node.name}.{_name_of(child)}") for child in node.body]
        for item, name in candidates:
            if name in names:
                start = min([item.lineno, *(d.lineno for d in getattr(item, "decorator_list", []))])
                spans.append((start, item.end_lineno))
                found.add(name)
    missing = set(names) - found
    if missing:
        sys.exit(f"not found: {sorted(missing)}")
    return spans


def count(revision: str, selection: dict[str, list[str] | None]) -> dict[str, int]:
    counts = {}
    for path, names in selection.items():
        source = (
            (REPO / path).read_text()
            if revision == "."
            else subprocess.run(
                ["git", "show", f"{revision}:{path}"],
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        code = _code_lines(source)
        counts[path] = sum(
            1
            for start, end in _spans(source, names)
            for line in range(start, end + 1)
            if line in code
        )
    return counts


def main() -> None:
    before, after = (sys.argv[1:] + ["53d900f", "HEAD"])[:2]
    for label, revision, selection in (("before", before, BEFORE), ("after", after, AFTER)):
        counts = count(revision, selection)
        print(f"{label} ({revision}): {sum(counts.values())} lines of code")
        for path, lines in counts.items():
            print(f"  {path}: {lines}")


if __name__ == "__main__":
    main()
