"""`python -m tuner` with one fault injected once, for the fault tests and `fault_matrix.py`.

    python scripts/fault_worker.py FAULT MARKER [tuner overrides ...]

The fault strikes the first time its moment comes in any worker that shares MARKER (a file
created when it strikes), so a study sees it once however many workers run:

- `none`: no fault.
- `kill-after-create`: SIGKILL right after the storage created a trial, before its first
  heartbeat.
- `drop-after-commit`: the storage creates a trial, then the call fails as if the connection
  dropped after the commit (SQLAlchemy's OperationalError).
- `teacher-fetch-fails`: the first download of the stored teacher fails (an MLflow 503).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path


def _strikes(marker: Path) -> bool:
    """True once across every process sharing `marker`."""
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(descriptor)
    return True


def _after_create(marker: Path, strike) -> None:
    from optuna.storages import RDBStorage

    create = RDBStorage.create_new_trial

    def create_new_trial(self, study_id, template_trial=None):
        trial_id = create(self, study_id, template_trial)
        # A trial `study.ask` creates (no template): it is RUNNING, its heartbeat thread unstarted.
        if template_trial is None and _strikes(marker):
            strike()
        return trial_id

    RDBStorage.create_new_trial = create_new_trial


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _drop() -> None:
    import sqlalchemy.exc

    raise sqlalchemy.exc.OperationalError(
        "INSERT INTO trials ...", {}, Exception("server closed the connection unexpectedly")
    )


def _teacher_fetch_fails(marker: Path) -> None:
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    download = mlflow.artifacts.download_artifacts

    def download_artifacts(*args, **kwargs):
        if _strikes(marker):
            raise MlflowException("503 Service Unavailable", error_code="TEMPORARILY_UNAVAILABLE")
        return download(*args, **kwargs)

    mlflow.artifacts.download_artifacts = download_artifacts


def main() -> None:
    fault, marker, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    installs = {
        "none": lambda: None,
        "kill-after-create": lambda: _after_create(marker, _kill),
        "drop-after-commit": lambda: _after_create(marker, _drop),
        "teacher-fetch-fails": lambda: _teacher_fetch_fails(marker),
    }
    if fault not in installs:
        sys.exit(f"unknown fault {fault!r}; one of {', '.join(installs)}")
    installs[fault]()
    sys.argv = ["tuner", *overrides]
    runpy.run_module("tuner", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
