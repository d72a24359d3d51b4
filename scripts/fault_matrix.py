"""The workers' fault matrix: each fault against SQLite and PostgreSQL, and what the study holds
after it (docs/workers.md, "Faults").

    python scripts/fault_matrix.py [--faults F ...] [--storages sqlite postgresql] [--timeout S]

Every cell is a real `debug=smoke` bert_ffn study that distils (its teacher trained in the
study), run by real worker processes (`scripts/fault_worker.py`) on a fresh database; the
PostgreSQL cells use the private server of `scripts/postgres.sh` (restarted for the outages).
A cell reports whether the study finished (every worker exited 0 within the timeout and no trial
is left running or waiting), trials lost (left running or waiting, or failed for a dead worker
and never retried), configurations trained twice (a configuration with two points on one
backend) and teachers trained (runs holding a stored teacher).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDY = "bert_ffn-smoke"
SMOKE = ("+experiment=bert_ffn", "debug=smoke", "deploy.backend=eager", "train.distill.alpha=0.5")
# Dead workers are found within seconds. Outages run with the default heartbeat settings, the
# ones a user has.
QUICK = ("study.heartbeat.interval=1", "study.heartbeat.grace_period=6")


class Worker:
    """One worker process, its output collected as it runs."""

    def __init__(self, cwd: Path, fault: str, marker: Path, overrides: list[str], env=None):
        cwd.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(REPO / "scripts" / "fault_worker.py"), fault, str(marker)]
        command += [*overrides, f"hydra.run.dir={cwd}/outputs"]
        if env and env.get("FAKETIME"):
            command = ["faketime", "-f", env["FAKETIME"], *command]
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@dataclass
class Cell:
    storage: str
    url: str
    tracking: str
    directory: Path
    timeout: float
    # The outcome, where it must be read before the cell's action ends (its tracking server).
    counts: dict[str, int] | None = None

    def overrides(self, *extra: str) -> list[str]:
        return [*SMOKE, *extra, f"study.storage={self.url}", f"tracking.uri={self.tracking}"]

    def worker(self, name: str, fault: str = "none", *extra: str, env=None) -> Worker:
        marker = self.directory / "fault-struck"
        return Worker(self.directory / name, fault, marker, self.overrides(*extra), env)

    def finish(self, workers: list[Worker], allowed: tuple[int, ...] = (0,)) -> bool:
        """Whether every worker exits with an allowed code before the cell's timeout."""
        deadline = time.monotonic() + self.timeout
        ok = True
        for worker in workers:
            try:
                code = worker.process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                code = None
            ok = ok and code in allowed
        return ok


def _postgres(action: str) -> str:
    script = REPO / "scripts" / "postgres.sh"
    return subprocess.run(
        ["bash", str(script), action], check=True, capture_output=True, text=True
    ).stdout.strip()


def _fresh_postgres(name: str) -> str:
    import sqlalchemy

    base = _postgres("url")
    admin = sqlalchemy.create_engine(
        f"{base}/postgres", isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
    )
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return f"{base}/{name}"


# Each fault: (storage kinds it applies to, what it does to a cell) -> whether workers finished.
def _kill_after_create(cell: Cell) -> bool:
    first = cell.worker("a", "kill-after-create", *QUICK)
    first.process.wait(timeout=cell.timeout)
    return cell.finish([cell.worker("b", "none", *QUICK)])


def _kill_mid_training(cell: Cell) -> bool:
    first = cell.worker("a", "none", *QUICK)
    # A student trains once the teacher is stored: kill the worker in its first epoch.
    first.wait_for("Trial 2/", cell.timeout)
    time.sleep(3)
    first.process.kill()
    first.process.wait()
    return cell.finish([cell.worker("b", "none", *QUICK)])


def _term_during_teacher(cell: Cell) -> bool:
    first = cell.worker("a", "none", *QUICK)
    first.wait_for("Training the distillation teacher", cell.timeout)
    time.sleep(3)
    first.process.send_signal(signal.SIGTERM)
    first.process.wait(timeout=cell.timeout)
    return cell.finish([cell.worker("b", "none", *QUICK)])


def _drop_after_commit(cell: Cell) -> bool:
    return cell.finish([cell.worker("a", "drop-after-commit", *QUICK)])


def _outage(seconds: float) -> Callable[[Cell], bool]:
    def run(cell: Cell) -> bool:
        workers = [cell.worker(name, "none") for name in ("a", "b")]
        # Both workers busy (the teacher trains, the other waits for it), then the outage.
        workers[0].wait_for("distillation teacher", cell.timeout)
        time.sleep(5)
        _postgres("stop")
        time.sleep(seconds)
        _postgres("start")
        return cell.finish(workers)

    return run


@contextmanager
def mlflow_server(directory: Path) -> Iterator[str]:
    """A real `mlflow server` on loopback that serves artifacts, as a team's is: a stored
    teacher is then downloaded over HTTP, not read from a local path. Its URL."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{directory}/mlflow-server.db"]
    command += ["--artifacts-destination", str(directory / "mlflow-artifacts")]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    with open(directory / "mlflow-server.log", "w") as log:
        server = subprocess.Popen(
            command, cwd=directory, env=env, stdout=log, stderr=log, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((directory / "mlflow-server.log").read_text()) from None
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _teacher_fetch_fails(cell: Cell) -> bool:
    with mlflow_server(cell.directory) as url:
        cell.tracking = url
        finished = cell.finish([cell.worker("a", "teacher-fetch-fails", *QUICK)])
        # Counted while the server runs: the outcome reads its runs.
        cell.counts = outcome(cell.url, cell.tracking)
    return finished


def _front_with_skewed_clocks(cell: Cell) -> bool:
    sessions = ("deploy.latency.front_sessions=2",)
    workers = [
        cell.worker("a", "none", *QUICK, *sessions),
        cell.worker("b", "none", *QUICK, *sessions, env={"FAKETIME": "+5s"}),
    ]
    return cell.finish(workers)


FAULTS: dict[str, tuple[tuple[str, ...], Callable[[Cell], bool]]] = {
    "SIGKILL between trial creation and first heartbeat": (
        ("sqlite", "postgresql"),
        _kill_after_create,
    ),
    "SIGKILL mid-training": (("sqlite", "postgresql"), _kill_mid_training),
    "SIGTERM during the teacher": (("sqlite", "postgresql"), _term_during_teacher),
    "connection dropped after a committed write": (
        ("sqlite", "postgresql"),
        _drop_after_commit,
    ),
    "PostgreSQL outage of 15 s, two workers": (("postgresql",), _outage(15)),
    "PostgreSQL outage of 90 s, two workers": (("postgresql",), _outage(90)),
    "teacher download failing once": (("sqlite", "postgresql"), _teacher_fetch_fails),
    "front confirmation, two workers, clocks 5 s apart": (
        ("postgresql",),
        _front_with_skewed_clocks,
    ),
}


def outcome(url: str, tracking: str) -> dict[str, int]:
    """Trials lost, configurations trained twice and teachers trained, read from the study's
    records alone."""
    import optuna
    from mlflow import MlflowClient

    from tuner.keys import FAIL_REASON_ATTR, TRAINED_IN_ATTR
    from tuner.store import budget

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=STUDY, storage=url).get_trials(deepcopy=False)
    retried = budget.retried_numbers(trials)
    unfinished = [t for t in trials if not t.state.is_finished()]
    died = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.FAIL
        and FAIL_REASON_ATTR not in t.user_attrs
        and t.number not in retried
    ]
    by_number = {t.number: t for t in trials}
    points = Counter(
        (
            budget.configuration_of(by_number[t.user_attrs.get(TRAINED_IN_ATTR, t.number)]),
            t.user_attrs.get("deploy.backend"),
        )
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
    )
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], max_results=1000) if experiment else []
    teachers = sum(1 for run in runs if client.list_artifacts(run.info.run_id, "teacher"))
    return {
        "lost": len(unfinished) + len(died),
        "twice": sum(1 for count in points.values() if count > 1),
        "teachers": teachers,
    }


def run_cell(fault: str, storage: str, timeout: float) -> str:
    applies, action = FAULTS[fault]
    if storage not in applies:
        return "n/a"
    with tempfile.TemporaryDirectory(prefix="tuner-fault-") as workdir:
        directory = Path(workdir)
        name = f"fault_{abs(hash((fault, storage, time.time()))) % 10**8}"
        url = f"sqlite:///{directory}/optuna.db" if storage == "sqlite" else _fresh_postgres(name)
        cell = Cell(storage, url, f"sqlite:///{directory}/mlflow.db", directory, timeout)
        started = time.monotonic()
        finished = action(cell)
        seconds = time.monotonic() - started
        try:
            counts = cell.counts or outcome(url, cell.tracking)
        except Exception as exc:  # no study at all: nothing to count
            return f"not finished ({type(exc).__name__}), {seconds:.0f} s"
        word = "finished" if finished else "NOT finished"
        return (
            f"{word}; {counts['lost']} lost / {counts['twice']} twice / "
            f"{counts['teachers']} teacher(s); {seconds:.0f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="*", default=list(FAULTS), choices=list(FAULTS))
    parser.add_argument("--storages", nargs="*", default=["sqlite", "postgresql"])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    args = parser.parse_args()
    if "postgresql" in args.storages:
        _postgres("start")
    print("| fault | " + " | ".join(args.storages) + " |")
    print("|---|" + "---|" * len(args.storages))
    for fault in args.faults:
        cells = [run_cell(fault, storage, args.timeout) for storage in args.storages]
        print(f"| {fault} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
