"""The MLflow UI, in a real browser, shows a smoke study: its runs and the front on the parent run.

A real `mlflow server` reads the study's SQLite store and headless Chromium renders its pages, so
this checks what a user sees in `mlflow ui`, not only what the tracking API returns.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import TWO_BACKENDS, run_cli
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from tuner.keys import ROLE_TAG

# Real studies in subprocesses: the full suite's, not the fast selection's.
pytestmark = pytest.mark.slow

try:
    from playwright.sync_api import Locator, Page, sync_playwright
except ImportError:  # `_require_browser` fails the test with the remedy
    sync_playwright = None

SMOKE = ("+experiment=bert_ffn", "debug=smoke", TWO_BACKENDS)
# `tracking.experiment` is the study name, which smoke mode suffixes with `-smoke`.
EXPERIMENT = "bert_ffn-smoke"
# Artifacts the parent run holds under `pareto/`.
PARETO_ARTIFACTS = ("front.csv", "front.png", "front.html")

CHROMIUM = Path("/usr/bin/chromium")
# No sandbox (CI runs as root), no GPU, and nothing that reaches out beyond 127.0.0.1.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]
# Every wait for the UI is bounded; the UI polls the server, so waits are for elements, never
# for network idleness.
WAIT_MS = 60_000
SERVER_START_S = 120


@dataclass(frozen=True)
class Study:
    """The study's MLflow records as the tracking API reports them: what the UI must show."""

    experiment_id: str
    parent: Run
    trials: list[Run]


@pytest.fixture
def mlflow_server(tmp_path) -> Iterator[Callable[[Path], str]]:
    """Starts `mlflow server` on a SQLite store and returns its base URL; always stopped after.

    No artifact options are needed: runs logged straight to the SQLite store keep local artifact
    paths, which the server lists and serves to the UI as they are.
    """
    started: list[subprocess.Popen] = []

    def start(store: Path) -> str:
        port = _free_port()
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{store}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        # No job runner (a pool of background workers the UI pages never use) and no telemetry
        # (nothing beyond 127.0.0.1 is reachable in CI).
        env = {
            **os.environ,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        log = tmp_path / "mlflow_server.log"
        with log.open("w") as out:
            # Its own process group: the server runs uvicorn in a child process.
            server = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(server)
        base = f"http://127.0.0.1:{port}"
        _wait_until_healthy(base, server, log)
        return base

    yield start
    for server in started:
        _stop(server)


def _require_browser() -> None:
    """Fail, not skip, without the browser, so that CI cannot pass without running this test."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (Debian packages chromium, chromium-driver)")
    if sync_playwright is None:
        missing.append("the playwright Python package (the `test` extra)")
    if missing:
        message = f"browser test needs {' and '.join(missing)}; `.ci/run` installs them"
        pytest.fail(message, pytrace=False)


def _run_smoke_study(tmp_path: Path) -> Study:
    """A real smoke study, tracked in tmp_path/mlflow.db, and its runs as the API reports them."""
    result = run_cli(tmp_path, *SMOKE)
    assert result.returncode == 0, result.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"no MLflow experiment {EXPERIMENT!r}"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get(ROLE_TAG) == "study"]
    trials = [r for r in runs if r.data.tags.get(ROLE_TAG) == "trial"]
    assert len(parents) == 1 and trials
    return Study(experiment.experiment_id, parents[0], trials)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_healthy(base: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy after {SERVER_START_S} s:\n{log.read_text()}")


def _stop(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _route(url: str) -> str:
    """The UI's client-side route: the URL fragment without its query."""
    return urlsplit(url).fragment.split("?")[0]


def _screenshot(page: Page, path: Path) -> None:
    page.screenshot(path=path)
    assert path.stat().st_size > 0, f"empty screenshot {path}"


def _check_run_list(page: Page, base: str, study: Study, shot: Path) -> None:
    """The experiment's runs: the parent run, and each trial run once the parent is unfolded."""
    # The runs view's own address: the experiment's plain address opens its GenAI overview.
    page.goto(f"{base}/#/experiments/{study.experiment_id}/runs")
    page.wait_for_url(lambda url: _route(url) == f"/experiments/{study.experiment_id}/runs")
    parent = page.get_by_role("link", name=study.parent.info.run_name, exact=True)
    parent.wait_for()
    # Child runs are folded under their parent; the button in its name cell unfolds them.
    page.get_by_role("gridcell").filter(has=parent).get_by_role("button").click()
    for trial in study.trials:
        page.get_by_role("link", name=trial.info.run_name, exact=True).wait_for()
    _screenshot(page, shot)
    _show_front_columns(page, study, shot.with_name("run_list_front_columns.png"))


# What the README tells a user to pick under "Columns" to read the front off the run list.
FRONT_COLUMNS = ("val_accuracy", "latency_ms_p50", "deploy.backend", "pareto")
# Attribute columns unticked to make room for them.
SPARE_COLUMNS = ("Dataset", "Source", "Models")


def _show_front_columns(page: Page, study: Study, shot: Path) -> None:
    """Columns -> search each name -> tick it: the runs show accuracy, latency, backend and the
    `pareto` tag side by side, and each trial's row holds its own `pareto` value."""
    page.get_by_role("button", name="Columns").click()
    search = page.get_by_placeholder("Search columns")
    for name in SPARE_COLUMNS + FRONT_COLUMNS:
        search.fill(name)
        page.get_by_text(name, exact=True).last.click()
    page.keyboard.press("Escape")
    for name in ("val_accuracy", "pareto"):
        page.get_by_role("columnheader").filter(has_text=name).first.wait_for()
    for trial in study.trials:
        link = page.get_by_role("link", name=trial.info.run_name, exact=True)
        # The grid draws the pinned name column and the others as separate rows of one index.
        index = page.get_by_role("row").filter(has=link).get_attribute("aria-rowindex")
        row = page.locator(f'[role="row"][aria-rowindex="{index}"]')
        row.get_by_role("gridcell", name=trial.data.tags["pareto"], exact=True).wait_for()
    _screenshot(page, shot)


def _open_parent_artifacts(page: Page, study: Study) -> None:
    """From the run list to the parent run's page, then its Artifacts tab, with `pareto` open."""
    run_page = f"/experiments/{study.experiment_id}/runs/{study.parent.info.run_id}"
    page.get_by_role("link", name=study.parent.info.run_name, exact=True).click()
    page.wait_for_url(lambda url: _route(url) == run_page)
    page.get_by_role("tab", name="Artifacts").click()
    page.wait_for_url(lambda url: _route(url) == f"{run_page}/artifacts")
    _tree_node(page, "pareto").click()


def _tree_node(page: Page, name: str) -> Locator:
    return page.locator(f'[data-testid="artifact-tree-node"][artifact-name="{name}"]')


def _check_preview(page: Page, name: str, shot: Path) -> None:
    """Select `pareto/NAME` in the open tree; its preview must render, not just be listed."""
    _tree_node(page, name).click()
    # The preview's header names the file by its full artifact path.
    page.get_by_title(f"pareto/{name}", exact=True).wait_for()
    if name.endswith(".csv"):
        page.get_by_role("columnheader", name="val_accuracy").wait_for()
    elif name.endswith(".png"):
        image = page.get_by_role("img", name=f"pareto/{name}")
        width = image.evaluate("img => img.decode().then(() => img.naturalWidth)")
        assert width > 0, f"pareto/{name} did not render"
    elif name.endswith(".html"):
        # The page runs in a sandboxed frame; a drawn figure shows its scripts ran.
        page.frame_locator("iframe.mlflow-html-iframe").locator("svg").first.wait_for()
    _screenshot(page, shot)


def test_mlflow_ui_shows_the_study_and_its_front(tmp_path, mlflow_server):
    _require_browser()
    study = _run_smoke_study(tmp_path)
    base = mlflow_server(tmp_path / "mlflow.db")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        _check_run_list(page, base, study, tmp_path / "run_list.png")
        _open_parent_artifacts(page, study)
        for name in PARETO_ARTIFACTS:
            shot = tmp_path / f"parent_run_artifact_{name.replace('.', '_')}.png"
            _check_preview(page, name, shot)
