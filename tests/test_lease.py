"""The study's lease (`tuner.lease`): exclusive between real processes whatever their clocks say,
released when its holder dies, and nothing left behind. SQLite and the private PostgreSQL."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy

# Holds the lease for HOLD seconds and writes when it went in and out, by its own clock.
_HOLDER = """
import sys, time
from tuner.lease import Leases
url, log, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
with Leases(url, "s").hold("front"):
    with open(log, "a") as f:
        f.write(f"in {sys.argv[4]}\\n")
    print("held", flush=True)
    time.sleep(hold)
    with open(log, "a") as f:
        f.write(f"out {sys.argv[4]}\\n")
"""


def _holder(
    url: str, log: Path, hold: float, name: str, clock_offset: str = ""
) -> subprocess.Popen:
    command = [sys.executable, "-c", _HOLDER, url, str(log), str(hold), name]
    if clock_offset:
        # The second worker's clock runs `clock_offset` ahead of the first's.
        command = ["faketime", "-f", clock_offset, *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/optuna.db"
    else:
        url = request.getfixturevalue("postgres_database")("lease")
    optuna.create_study(storage=url, study_name="s")
    return url


@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs Debian's faketime")
def test_two_workers_whose_clocks_are_5_s_apart_hold_the_lease_one_after_the_other(
    storage_url, tmp_path
):
    log = tmp_path / "log"
    workers = [
        _holder(storage_url, log, 1.0, "a"),
        _holder(storage_url, log, 1.0, "b", clock_offset="+5s"),
    ]
    for worker in workers:
        assert worker.wait(timeout=60) == 0
    lines = log.read_text().split()
    # In and out pairs, never two holders in at once.
    assert len(lines) == 8
    events = [lines[i : i + 2] for i in range(0, 8, 2)]
    assert events[0][0] == "in" and events[1] == ["out", events[0][1]]
    assert events[2][0] == "in" and events[3] == ["out", events[2][1]]
    assert {events[0][1], events[2][1]} == {"a", "b"}


def test_a_killed_holder_s_lease_is_released_and_leaves_nothing(storage_url, tmp_path):
    log = tmp_path / "log"
    first = _holder(storage_url, log, 600.0, "a")
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    started = time.monotonic()
    second = _holder(storage_url, log, 0.0, "b")
    assert second.wait(timeout=60) == 0
    assert time.monotonic() - started < 30
    assert log.read_text().split() == ["in", "a", "in", "b", "out", "b"]
    # No claim or lock record stays: not in the study, not in the database's lock table.
    assert optuna.load_study(study_name="s", storage=storage_url).user_attrs == {}
    if storage_url.startswith("postgresql"):
        engine = sqlalchemy.create_engine(storage_url, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as connection:
            held = connection.execute(
                sqlalchemy.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
            ).scalar()
        engine.dispose()
        assert held == 0
