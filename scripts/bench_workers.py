"""Throughput of one study worked on by 1 and by 2 single-threaded workers, and the time a
trial spends outside training and deployment (Optuna, MLflow, model logging, the front).

Each configuration runs real `python -m tuner` workers against fresh PostgreSQL databases (the
server of scripts/postgres.sh by default), then reads the study back:

    python scripts/bench_workers.py --trials 6
    python scripts/bench_workers.py --trials 6 --workers 1 2 --postgres postgresql+psycopg://...

Trials per hour = trained configurations / wall time from launch to the last worker's exit.
Overhead = worker time minus training (`train_seconds`) and deployment (`deploy_seconds`, all
backends) of the trials it ran, as a share of worker time; start-up (imports, data, model) is
reported apart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import sqlalchemy
from mlflow.tracking import MlflowClient

from tuner.keys import TRAINED_IN_TAG

REPO = Path(__file__).resolve().parent.parent
STUDY = "bert_ffn-smoke"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="study.n_trials (total)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--postgres", default=None, help="server URL without a database")
    parser.add_argument(
        "overrides", nargs="*", help="extra overrides for every worker (default: smoke sizes)"
    )
    return parser.parse_args()


def postgres_url(given: str | None) -> str:
    if given:
        return given
    script = REPO / "scripts" / "postgres.sh"
    subprocess.run(["bash", str(script), "start"], check=True)
    return subprocess.run(
        ["bash", str(script), "url"], check=True, capture_output=True, text=True
    ).stdout.strip()


def fresh_database(server: str, name: str) -> str:
    admin = sqlalchemy.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return f"{server}/{name}"


def run_workers(count: int, trials: int, server: str, extra: list[str]) -> dict[str, float]:
    storage = fresh_database(server, f"bench_w{count}_optuna")
    tracking = fresh_database(server, f"bench_w{count}_mlflow")
    MlflowClient(tracking).search_experiments()  # the schema, once, before workers race to it
    command = [
        sys.executable,
        "-m",
        "tuner",
        "+experiment=bert_ffn",
        "debug=smoke",
        f"debug.overrides.study.n_trials={trials}",
        "train.num_threads=1",
        "deploy.latency.num_threads=1",
        f"study.storage={storage}",
        f"tracking.uri={tracking}",
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    workers = []
    for index in range(count):
        workdir = Path(f"/tmp/bench_workers/w{count}_{index}")
        workdir.mkdir(parents=True, exist_ok=True)
        workers.append(
            subprocess.Popen(
                [*command, f"hydra.run.dir={workdir}/outputs"],
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    first_trial = [float("nan")] * count

    def watch(index: int, worker: subprocess.Popen) -> None:
        assert worker.stdout is not None
        for line in worker.stdout:
            if line.startswith("Trial ") and first_trial[index] != first_trial[index]:
                first_trial[index] = time.perf_counter() - started

    readers = [
        threading.Thread(target=watch, args=(index, worker)) for index, worker in enumerate(workers)
    ]
    for reader in readers:
        reader.start()
    for worker, reader in zip(workers, readers, strict=True):
        if worker.wait() != 0:
            raise SystemExit(f"a worker failed with status {worker.returncode}")
        reader.join()
    wall = time.perf_counter() - started
    return {"wall": wall, "startup": max(first_trial), **work_seconds(storage, tracking)}


def work_seconds(storage: str, tracking: str) -> dict[str, float]:
    study = optuna.load_study(study_name=STUDY, storage=storage)
    own = [
        t
        for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get("trained_in_trial") == t.number
    ]
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(STUDY)
    runs = client.search_runs([experiment.experiment_id], "tags.`tuner.role` = 'trial'")
    train = {r.data.tags[TRAINED_IN_TAG]: r.data.metrics["train_seconds"] for r in runs}
    deploy = sum(r.data.metrics.get("deploy_seconds", 0.0) for r in runs)
    return {"trained": float(len(own)), "train": sum(train.values()), "deploy": deploy}


def main() -> int:
    args = parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    server = postgres_url(args.postgres)
    print(
        "| workers | trained | wall s | trials/hour | start-up s | training s | deployment s "
        "| overhead share |\n|---|---|---|---|---|---|---|---|"
    )
    for count in args.workers:
        result = run_workers(count, args.trials, server, args.overrides)
        worker_seconds = (result["wall"] - result["startup"]) * count
        overhead = 1 - (result["train"] + result["deploy"]) / worker_seconds
        print(
            f"| {count} | {result['trained']:.0f} | {result['wall']:.0f} | "
            f"{3600 * result['trained'] / result['wall']:.0f} | {result['startup']:.0f} | "
            f"{result['train']:.0f} | {result['deploy']:.0f} | {100 * overhead:.0f}% |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
