"""A logged model carries only its runtime. In a fresh virtual environment holding nothing but
a logged model's own requirements, `mlflow.pyfunc.load_model` and `mlflow models serve` classify
raw texts and images with the labels that deployment measured, for a PyTorch, an ONNX Runtime
and an OpenVINO point; the runtimes' environments hold no PyTorch.

Slow: each environment installs its requirements from the package index (the PyTorch one a few
GB, from this machine's wheels where pip is set up to find them)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from conftest import PROTOCOL, REPO, TINY_BERT, TINY_BERT_DIR
from omegaconf import OmegaConf
from test_backends import DEPLOY
from test_serving import TEXTS, _log, tracking  # noqa: F401  (tracking is a fixture)

from tuner.deploy.backends import unavailable_backends
from tuner.deploy.pipeline import convert
from tuner.modalities.image import ImageModality
from tuner.modalities.text import TextModality
from tuner.training import collect_logits

pytestmark = pytest.mark.slow

# What the fresh environment runs: the logged model loaded as MLflow loads it, its labels for
# the examples, and whether PyTorch was imported or could have been.
_PROBE = """
import importlib.util, json, sys
import mlflow, numpy as np, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
examples = np.load(sys.argv[2])
given = pd.DataFrame({"text": examples.tolist()}) if examples.dtype.kind == "U" else examples
print(json.dumps({
    "labels": list(model.predict(given)["label"]),
    "torch_imported": "torch" in sys.modules,
    "torch_installed": importlib.util.find_spec("torch") is not None,
}))
"""


def _text_subject():
    """The tiny BERT with its tokenizer, its classifier's bias set so that the texts divide
    between the two labels (random weights alone give every text one label), far from any
    text's margin: at the midpoint of the widest gap between the middle third's margins, so
    that rounding in another process cannot change a label."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    model = TINY_BERT.build().eval()
    modality = TextModality(AutoTokenizer.from_pretrained(TINY_BERT_DIR), 48)
    with torch.no_grad():
        logits = collect_logits(model, modality.encode(TEXTS))
        margins = (logits[:, 1] - logits[:, 0]).sort().values
        middle = margins[len(margins) // 3 : 2 * len(margins) // 3]
        widest = int((middle[1:] - middle[:-1]).argmax())
        model.head.out.bias[0] += (middle[widest] + middle[widest + 1]) / 2
    return model, TINY_BERT, modality, np.asarray(TEXTS), ["rotten", "fresh"]


def _image_subject(image_subject):
    from tuner.data import load_splits

    splits = load_splits(OmegaConf.load(REPO / "conf" / "data" / "digits.yaml"))
    modality = ImageModality.from_config(OmegaConf.create({"model": {"in_chans": 1}}), splits)
    items = np.asarray(splits.val.items[:100], dtype=np.float32)
    return image_subject.model, image_subject.recipe, modality, items, list(splits.label_names)


def _logged(name, subject, tracking, tmp_path) -> tuple[Path, list[str]]:  # noqa: F811
    """The point's model logged as a study logs it, in a local directory, and the labels its
    deployment measured for the examples."""
    model, recipe, modality, items, label_names = subject
    encoded = modality.encode(items)
    example = modality.example(items, PROTOCOL)
    calibration = [batch.inputs for batch in encoded.batches(32)][:2]
    converted = convert(name, model, recipe, example, DEPLOY, tmp_path / name, calibration)
    measured = collect_logits(converted.logits_of, encoded).argmax(dim=-1).tolist()
    uri, _ = _log(tracking, converted, name, modality, items, label_names, tmp_path)
    local = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "logged")))
    return local, [label_names[i] for i in measured]


def _fresh_environment(requirements: Path, where: Path) -> Path:
    """A new virtual environment with the requirements installed, and nothing else. pip
    compiles every installed module's bytecode unless told not to; here only the modules used
    compile, as they are first imported."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    installed = subprocess.run(
        [*pip, "-r", str(requirements)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert installed.returncode == 0, f"{requirements.read_text()}\n{installed.stderr[-3000:]}"
    return where


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _served_labels(environment: Path, model_dir: Path, examples: np.ndarray) -> list[str]:
    """The labels `mlflow models serve`, run from the environment, answers for the examples."""
    port = _free_port()
    # As a user runs it, with the environment active: MLflow starts its server from PATH.
    env = {**os.environ, "PATH": f"{environment / 'bin'}:{os.environ['PATH']}"}
    command = ["mlflow", "models", "serve", "-m", str(model_dir), "--env-manager", "local"]
    server = subprocess.Popen(
        [*command, "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    body = (
        {"dataframe_split": {"columns": ["text"], "data": [[t] for t in examples.tolist()]}}
        if examples.dtype.kind == "U"
        else {"inputs": examples.tolist()}
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "the model server did not answer /ping"
                time.sleep(1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return [row["label"] for row in json.loads(response.read())["predictions"]]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


@pytest.mark.parametrize(
    ("name", "modality", "runtime"),
    [
        ("eager", "text", None),
        ("onnxruntime_int8", "text", "onnxruntime"),
        ("openvino", "image", "openvino"),
    ],
)
def test_a_logged_model_serves_from_an_environment_of_its_own_requirements(
    name,
    modality,
    runtime,
    image_subject,
    tracking,  # noqa: F811
    tmp_path,
):
    # A backend this machine cannot run has no point to serve here.
    left_out = unavailable_backends([name])
    if left_out:
        pytest.skip(f"{name} is unavailable here: {left_out[name]}")
    subject = _text_subject() if modality == "text" else _image_subject(image_subject)
    model_dir, expected = _logged(name, subject, tracking, tmp_path)
    assert len(set(expected)) > 1, "the examples must not all get one label"
    requirements = (model_dir / "requirements.txt").read_text().split()
    packages = {line.split("==")[0] for line in requirements}
    assert {"mlflow", "numpy", "pandas"} <= packages
    if runtime is None:
        assert "torch" in packages
    else:
        assert runtime in packages
        assert not packages & {"torch", "transformers", "timm", "torchvision"}, packages
    assert ("tokenizers" in packages) == (modality == "text")

    environment = _fresh_environment(model_dir / "requirements.txt", tmp_path / "venv")
    examples_file = tmp_path / "examples.npy"
    np.save(examples_file, subject[3])
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    # Run from a directory of its own, so that nothing of this checkout is importable.
    loaded = subprocess.run(
        [str(environment / "bin" / "python"), str(probe), str(model_dir), str(examples_file)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    found = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert found["labels"] == expected
    assert found["torch_installed"] == (runtime is None)
    assert found["torch_imported"] == (runtime is None)

    assert _served_labels(environment, model_dir, subject[3]) == expected
