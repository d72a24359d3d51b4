"""The study's lease (`tuner.store.lease`): exclusive between real processes whatever their clocks
say, released when its holder dies, and nothing left behind. SQLite and the private PostgreSQL."""

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
import warm

# Marks that it asks for the lease (ASKING), holds it, and once the file UNTIL exists ("-": at
# once) goes on holding for HOLD seconds; writes when it went in and out, by its own clock.
_HOLDER = """
import os, sys, time
from tuner.store import Leases
url, log, hold, name, until = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
open(log + ".asking." + name, "w").close()
with Leases(url, "s").hold("front"):
    with open(log, "a") as f:
        f.write(f"in {name}\\n")
    print("held", flush=True)
    while until != "-" and not os.path.exists(until):
        time.sleep(0.05)
    time.sleep(hold)
    with open(log, "a") as f:
        f.write(f"out {name}\\n")
"""


def _holder(
    url: str, log: Path, hold: float, name: str, clock_offset: str = "", until: str = "-"
) -> subprocess.Popen:
    command = [sys.executable, "-c", _HOLDER, url, str(log), str(hold), name, until]
    if clock_offset:
        # The second worker's clock is `clock_offset` from the first's.
        command = ["faketime", "-f", clock_offset, *command]
    return warm.Popen(command, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def study_url(storage_url):
    optuna.create_study(storage=storage_url, study_name="s")
    return storage_url


@pytest.mark.slow  # two processes under faketime, each importing tuner: 4-6 s on 2 cores
@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs Debian's faketime")
def test_a_worker_whose_clock_is_5_s_behind_waits_for_the_holder(study_url, tmp_path):
    # Timestamped claims let such a worker in at once: its claim looked the earlier one.
    log = tmp_path / "log"
    # The first holds on until the second has asked, and half a second more while it waits.
    first = _holder(study_url, log, 0.5, "a", until=f"{log}.asking.b")
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    second = _holder(study_url, log, 0.0, "b", clock_offset="-5s")
    for worker in (first, second):
        assert worker.wait(timeout=60) == 0
    assert log.read_text().split() == ["in", "a", "out", "a", "in", "b", "out", "b"]


def test_a_killed_holder_s_lease_is_released_and_leaves_nothing(study_url, tmp_path):
    log = tmp_path / "log"
    first = _holder(study_url, log, 600.0, "a")
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    started = time.monotonic()
    second = _holder(study_url, log, 0.0, "b")
    assert second.wait(timeout=60) == 0
    assert time.monotonic() - started < 30
    assert log.read_text().split() == ["in", "a", "in", "b", "out", "b"]
    # No claim or lock record stays: not in the study, not in the database's lock table.
    assert optuna.load_study(study_name="s", storage=study_url).user_attrs == {}
    if study_url.startswith("postgresql"):
        engine = sqlalchemy.create_engine(study_url, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect() as connection:
            held = connection.execute(
                sqlalchemy.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            ).scalar()
        engine.dispose()
        assert held == 0


def test_a_lease_asked_for_without_waiting_is_refused_at_once_while_another_holds_it(
    study_url, tmp_path
):
    from tuner.store import LeaseHeld, Leases

    first = _holder(study_url, tmp_path / "log", 600.0, "a")
    assert first.stdout is not None and first.stdout.readline() == "held\n"
    started = time.monotonic()
    with pytest.raises(LeaseHeld), Leases(study_url, "s").hold("front", wait=False):
        pass
    assert time.monotonic() - started < 5
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    with Leases(study_url, "s").hold("front", wait=False):
        held = True
    assert held
