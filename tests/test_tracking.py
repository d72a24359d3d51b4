"""The tracking store under several workers: opening it is safe when they start together."""

from __future__ import annotations

import subprocess
import sys
import time

_OPEN_AT = """
import sys, time
from tuner.tracking import Tracker
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
Tracker(f"sqlite:///{sys.argv[1]}/mlflow.db", "study")
"""


def test_workers_that_start_together_share_a_new_sqlite_tracking_store(tmp_path):
    # Both create MLflow's database at the same moment, as two workers started together in
    # one working directory do with the default tracking.uri: MLflow's schema migrations of
    # one then broke the other's ("Online migration expected to match one row ...").
    # Without the lock this failed every time it was tried.
    start = time.time() + 5  # past both interpreters' imports
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT, str(tmp_path), repr(start)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for worker in workers:
        _, errors = worker.communicate(timeout=120)
        assert worker.returncode == 0, errors
