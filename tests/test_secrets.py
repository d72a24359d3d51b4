"""A password in `study.storage` or `tracking.uri` is masked wherever tuner writes or prints the
URL: the masking itself, and a real smoke study on PostgreSQL searched for the password."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import optuna
import pytest
import warm
from conftest import TWO_BACKENDS
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from sqlalchemy.engine import make_url

from tuner.front.points import Point, study_points
from tuner.secrets import mask_url, mask_urls_in, masked_yaml
from tuner.tracking.retrain import retrain_command

UNCHANGED = None


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql+psycopg://user:s3cret@db.example:5432/tuner",
            "postgresql+psycopg://user:***@db.example:5432/tuner",
        ),
        ("postgresql+psycopg://user@db.example:5432/tuner", UNCHANGED),
        ("postgresql+psycopg://db.example/tuner", UNCHANGED),
        ("mysql+pymysql://root:s3cret@[::1]:3306/db", "mysql+pymysql://root:***@[::1]:3306/db"),
        ("http://user:s3cret@mlflow.example:5000", "http://user:***@mlflow.example:5000"),
        (
            "https://user:s3cret@mlflow.example/api/?x=1#top",
            "https://user:***@mlflow.example/api/?x=1#top",
        ),
        ("http://mlflow.example:5000", UNCHANGED),
        ("http://user@mlflow.example:5000", UNCHANGED),
        ("sqlite:///optuna.db", UNCHANGED),
        ("sqlite:////shared/runs/mlflow.db?timeout=30", UNCHANGED),
        ("journal:///shared/study.log", UNCHANGED),
        (
            "postgresql+psycopg://user@host/db?sslmode=require&password=s3cret",
            "postgresql+psycopg://user@host/db?sslmode=require&password=***",
        ),
        (
            "postgresql+psycopg://user:s3cret@host/db?password=s3cret&sslmode=require",
            "postgresql+psycopg://user:***@host/db?password=***&sslmode=require",
        ),
        # The query is kept as typed (not re-ordered or re-encoded) where the userinfo is masked.
        (
            "postgresql://user:s3cret@/db?z=1&host=/var/run/postgresql",
            "postgresql://user:***@/db?z=1&host=/var/run/postgresql",
        ),
        ("plain words, no url", UNCHANGED),
        ("", UNCHANGED),
    ],
)
def test_mask_url(url, expected):
    assert mask_url(url) == (url if expected is UNCHANGED else expected)


def test_masks_every_url_quoted_in_text():
    text = (
        "cannot open postgresql+psycopg://u:s3cret@h/db: refused; "
        "tracking at 'http://u:s3cret@h:5000' and sqlite:///mlflow.db"
    )
    assert mask_urls_in(text) == (
        "cannot open postgresql+psycopg://u:***@h/db: refused; "
        "tracking at 'http://u:***@h:5000' and sqlite:///mlflow.db"
    )


def test_logged_config_masks_the_urls_and_keeps_everything_else():
    cfg = OmegaConf.create(
        {
            "study": {"name": "s", "storage": "postgresql+psycopg://u:s3cret@h/db"},
            "tracking": {"uri": "http://u:s3cret@h:5000", "experiment": "${study.name}"},
            "train": {"lr": 0.001, "layers": [1, 2]},
        }
    )
    assert masked_yaml(cfg) == (
        "study:\n"
        "  name: s\n"
        "  storage: postgresql+psycopg://u:***@h/db\n"
        "tracking:\n"
        "  uri: http://u:***@h:5000\n"
        "  experiment: ${study.name}\n"
        "train:\n"
        "  lr: 0.001\n"
        "  layers:\n"
        "  - 1\n"
        "  - 2\n"
    )


def test_retrain_command_masks_the_storage_password():
    overrides = ["+experiment=bert_ffn", "study.storage=postgresql+psycopg://u:s3cret@h/db"]
    assert retrain_command(overrides) == (
        "python -m tuner +experiment=bert_ffn 'study.storage=postgresql+psycopg://u:***@h/db'"
    )


PASSWORD = "S3cretPw"
SMOKE = ("+experiment=bert_ffn", "debug=smoke", TWO_BACKENDS)
STUDY = "bert_ffn-smoke"


def _with_password(url: str) -> str:
    # The test server trusts local connections, so any password connects.
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def _run(cwd: Path, module: str, *args: str) -> str:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    command = [sys.executable, "-m", module, *args]
    result = warm.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def _files_holding(root: Path, secret: str) -> list[str]:
    return [
        str(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


def _mlflow_records_holding(tracking: str, secret: str) -> tuple[list[str], list[Path]]:
    """Every run's and logged model's tags and params that hold `secret`, and the local
    artifact roots of the experiments."""
    client = MlflowClient(tracking)
    experiments = client.search_experiments()
    ids = [e.experiment_id for e in experiments]
    found = [f"experiment {e.name} tags" for e in experiments if secret in json.dumps(e.tags)]
    for run in client.search_runs(ids, max_results=1000):
        for kind, values in (("tags", run.data.tags), ("params", run.data.params)):
            found += [f"run {run.info.run_id} {kind} {k}" for k, v in values.items() if secret in v]
    for model in client.search_logged_models(experiment_ids=ids):
        if secret in json.dumps({**model.tags, **model.params}):
            found.append(f"logged model {model.model_id}")
    roots = [Path(unquote(urlparse(e.artifact_location).path)) for e in experiments]
    return found, roots


def _logged_front_point(storage: str) -> Point:
    """A front point with a logged model, so that the report exports one whatever the timings
    made of the front (a point that joined it later has none)."""
    study = optuna.load_study(study_name=STUDY, storage=storage)
    logged = [p for p in study_points(study) if p.pareto and p.model_uri is not None]
    assert logged, "no point of the front has a logged model"
    return max(logged, key=lambda p: p.val_accuracy)


@pytest.mark.slow
def test_a_password_in_the_urls_is_written_and_printed_nowhere(tmp_path, postgres_database):
    storage = _with_password(postgres_database("optuna"))
    tracking = _with_password(postgres_database("mlflow"))
    stores = (f"study.storage={storage}", f"tracking.uri={tracking}")
    output = _run(tmp_path, "tuner", *SMOKE, *stores, f"hydra.run.dir={tmp_path}/outputs")

    assert PASSWORD not in output
    # The URL is still shown, with its password masked.
    assert "in postgresql+psycopg://postgres:***@127.0.0.1" in output
    found, roots = _mlflow_records_holding(tracking, PASSWORD)
    assert found == []
    assert any(root.is_dir() for root in roots)
    for root in roots:
        assert _files_holding(root, PASSWORD) == []
    # Searched where the URL is written: the logged config and the logged models' metadata.
    masked = [name for root in roots for name in _files_holding(root, "postgres:***@")]
    assert any(name.endswith("config.yaml") for name in masked), masked
    assert any(name.endswith("MLmodel") for name in masked), masked

    # The most accurate point within its own latency is the point itself.
    point = _logged_front_point(storage)
    export = tmp_path / "export"
    rule = ("--max-latency-ms", repr(point.latency_ms), "--skip-test")
    output = _run(tmp_path, "tuner.report", *SMOKE, *stores, *rule, "--export", str(export))
    assert PASSWORD not in output
    assert _files_holding(export, PASSWORD) == []
    summary = json.loads((export / "point.json").read_text())
    assert summary["trial"] == point.trial_number
    assert "'study.storage=postgresql+psycopg://postgres:***@127.0.0.1:" in summary["retrain"]
