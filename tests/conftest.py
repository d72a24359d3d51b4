from __future__ import annotations

import os

# OpenMP's threads sleep when they have no work, instead of spinning for it: the tests run in
# two processes on two cores (pytest-xdist), and a thread spinning in one process takes the
# core the other process's thread is working on. Read as PyTorch is imported, so it is set
# before that, here and in every process the tests start; one the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import warm
from mlflow_stores import stores_from_template
from omegaconf import OmegaConf
from postgres import (  # noqa: F401  (fixtures)
    postgres_database,
    postgres_server,
    restartable_postgres_database,
    storage_url,
)
from smoke_study import SMOKE
from torch import nn
from warm import pytest_collection_finish  # noqa: F401  (a hook)

from tuner.data.batches import Encoded, ExampleInputs
from tuner.data.tokens import TokenizedTexts
from tuner.deploy.backends import BACKENDS
from tuner.deploy.backends.compile import INDUCTOR_KERNELS
from tuner.latency.protocol import LatencyProtocol
from tuner.models.hf_encoder import SequenceClassifier
from tuner.models.recipe import ModelRecipe

REPO = Path(__file__).resolve().parent.parent
# Backends whose conversion compiles with Inductor (their points have no graph for that
# reason), 10-60 s a case on 2 cores: their per-backend cases run in the full suite, not in the
# fast selection.
COMPILING = frozenset(
    name for name in BACKENDS.names() if BACKENDS.get(name).no_graph_reason == INDUCTOR_KERNELS
)
# Backends whose conversion quantises against measured error, layer by layer (onnxruntime_mixed)
# or with NNCF (openvino_int8), 3-4 s a text case on 2 cores: their per-backend cases run in
# the full suite too, and the fast selection keeps one direct test of each
# (test_mixed_precision_keeps_the_layer_int8_hurts_most_in_fp32,
# test_int8_quantises_the_weighted_layers_and_lists_those_it_leaves).
SLOW_TO_CONVERT = COMPILING | {"onnxruntime_mixed", "openvino_int8"}


def backend_marks(name: str) -> list:
    """The marks of a test case that converts a model on backend `name`. The cases that compile
    with Inductor run one after another in one test process: a graph compiled by one case
    (the contract's, the served model's) is then found in Inductor's cache by the next, where
    two processes compiling the same graph at once would each pay for it, on a shared core."""
    marks = [pytest.mark.slow] if name in SLOW_TO_CONVERT else []
    if name in COMPILING:
        marks.append(pytest.mark.xdist_group("inductor"))
    if BACKENDS.get(name).device == "cuda":
        marks.append(pytest.mark.gpu)
    return marks


# Typed beside a smoke study in the tests of coordination, signals and records, which hold
# whatever the backends: each further backend costs its conversion and timing in every study.
TWO_BACKENDS = "deploy.backends=[eager,onnxruntime]"


def listed_backends(*overrides: str) -> list[str]:
    """The backends a composed experiment lists under `deploy.backend`, or those typed in
    `deploy.backends`."""
    from tuner.config.compose import compose_config
    from tuner.config.space import parse_expression

    cfg = compose_config(list(overrides))
    if cfg.deploy.backends is not None:
        return list(cfg.deploy.backends)
    listed = parse_expression("deploy.backend", cfg.search_space["deploy.backend"])
    return list(listed.choices) if hasattr(listed, "choices") else [listed]


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags as /proc/cpuinfo lists them (`flags` on x86,
    `Features` on Arm), read here, not through tuner."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# oneDNN's ISA names below AVX512_CORE_BF16, its first with bf16 kernels: capped at one of them
# (ONEDNN_MAX_CPU_ISA, or its old name DNNL_MAX_CPU_ISA), PyTorch computes bf16 emulated.
_BELOW_ONEDNN_BF16 = {
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
}


def _native_bf16() -> bool:
    """bf16 instructions (AVX-512 BF16 or AMX on x86, BF16 on Arm) that oneDNN may use."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    native = cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}
    return bool(native) and cap.strip().upper() not in _BELOW_ONEDNN_BF16


def _installed(*packages: str) -> bool:
    return all(importlib.util.find_spec(package) is not None for package in packages)


def _cpp_compiler() -> bool:
    return any(shutil.which(compiler) for compiler in ("c++", "g++", "clang++"))


def machine_runs(backend: str) -> bool:
    """Whether this machine has what `backend` needs, worked out here from what the machine
    shows (CPU flags, installed packages, compilers on PATH, the GPUs PyTorch sees), not
    through the backends' own availability checks: bf16 needs native bf16 instructions;
    torch.compile a C++ compiler for Inductor; PyTorch's int8 a quantized engine; the ONNX
    Runtime backends the onnx and onnxruntime packages; the OpenVINO ones onnx and openvino
    (and nncf to quantise); the cuda_* ones a CUDA GPU (bf16
    support for cuda_bf16, triton for cuda_compile). The rest run on any CPU."""
    if backend.startswith("cuda_"):
        if not torch.cuda.is_available():
            return False
        if backend == "cuda_bf16":
            return torch.cuda.is_bf16_supported()
        return backend != "cuda_compile" or _installed("triton")
    if backend.startswith("onnxruntime"):
        return _installed("onnx", "onnxruntime")
    if backend.startswith("openvino"):
        return _installed("onnx", "openvino") and (backend == "openvino" or _installed("nncf"))
    if backend in ("int8_dynamic", "int8_static"):
        engines = {"x86", "fbgemm", "onednn", "qnnpack"}
        return bool(engines & set(torch.backends.quantized.supported_engines))
    if backend.startswith("compile") and not _cpp_compiler():
        return False
    if backend.endswith("bf16"):  # bf16, compile_frozen_bf16
        return _native_bf16()
    return True


def runnable_backends(*overrides: str) -> list[str]:
    """The backends a composed experiment lists that this machine runs (`machine_runs`): what a
    study on this machine deploys every trained model on."""
    return [name for name in listed_backends(*overrides) if machine_runs(name)]


# A 2-layer BERT 32 wide with MiniLM's FFN width (1536) and 100 token ids (its tokenizer spells
# 30 of them), its config and tokenizer in the tests' own files: no pretrained package needed.
TINY_BERT_DIR = REPO / "tests" / "fixtures" / "tiny-bert"
TINY_BERT = ModelRecipe(
    model={
        **OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "minilm.yaml")),
        "name_or_path": str(TINY_BERT_DIR),
        "random_init": True,
    },
    num_labels=2,
)


@pytest.fixture
def tiny_bert() -> SequenceClassifier:
    """A random-init BERT with MiniLM's FFN width, small enough for unit tests."""
    torch.manual_seed(0)
    return TINY_BERT.build()


def separable_texts(n: int = 40) -> TokenizedTexts:
    """`n` texts of 4-12 token ids whose label is in their ids (ids 1-49 for label 0, 50-98
    for label 1): a tiny BERT learns them in a few epochs."""
    generator = torch.Generator().manual_seed(3)
    labels = torch.arange(n) % 2
    lengths = torch.randint(4, 12, (n,), generator=generator)
    ids = torch.randint(1, 50, (n, 12), generator=generator) + 49 * labels.unsqueeze(1)
    mask = (torch.arange(12) < lengths.unsqueeze(1)).long()
    return TokenizedTexts(ids * mask, mask, labels)


def train_cfg(**changes):
    """A `train` node for training tiny models in tests, with `changes` laid over it."""
    values = dict(
        optimizer="adam",
        device="cpu",
        precision="fp32",
        lr=1e-3,
        weight_decay=1e-5,
        grad_clip_norm=0.0,
        init="auto",
        mixup_alpha=0.0,
        epochs=2,
        batch_size=8,
        warmup_ratio=0.1,
        group_by_length=True,
        seed=0,
        num_threads=None,
    )
    return OmegaConf.create({**values, **changes})


PROTOCOL = LatencyProtocol(batch_size=1, seq_len=16, num_threads=2, warmup=1, repeats=3)


@dataclass(frozen=True)
class Subject:
    """A trained model to deploy, with what deployment needs besides it."""

    model: nn.Module
    recipe: ModelRecipe
    val_data: Encoded
    example: ExampleInputs
    calibration: list[tuple[torch.Tensor, ...]]


@pytest.fixture(scope="session", autouse=True)
def _mlflow_stores_from_template(tmp_path_factory) -> None:
    """New SQLite MLflow stores of this process start from a migrated template (mlflow_stores)."""
    stores_from_template(tmp_path_factory.mktemp("mlflow-template"))


@pytest.fixture(scope="session")
def image_subject() -> Subject:
    """`digits_subject`, trained once for the session."""
    return digits_subject()


def digits_subject() -> Subject:
    """A slim ResNet trained for one epoch on digits (70-85% validation accuracy, by the CPU
    it is trained on), so that its predictions are confident enough for int8 agreement to mean
    something."""
    from tuner.data import load_splits
    from tuner.modalities.image import ImageModality
    from tuner.models import build_model
    from tuner.training import batch_loss, initialise_new_layers, train

    splits = load_splits(OmegaConf.load(REPO / "conf" / "data" / "digits.yaml"))
    model_cfg = OmegaConf.merge(
        OmegaConf.load(REPO / "conf" / "model" / "resnet.yaml"),
        {"width_multiplier": 0.25, "depth": 1},
    )
    modality = ImageModality.from_config(OmegaConf.create({"model": {"in_chans": 1}}), splits)
    train_data = modality.encode(splits.train.items, splits.train.labels)
    val = modality.encode(splits.val.items, splits.val.labels)
    torch.manual_seed(0)
    model = build_model(model_cfg, splits.num_labels)
    initialise_new_layers(model.new_layers(), "auto")
    train_cfg = OmegaConf.merge(
        OmegaConf.load(REPO / "conf" / "train" / "default.yaml"),
        {"lr": 3e-3, "epochs": 1, "batch_size": 32},
    )
    train(model, train_data, val, train_cfg, batch_loss("image", train_cfg, splits.num_labels))
    calibration = [batch.inputs for batch in train_data.batches(32)][:4]
    example = modality.example(splits.val.items, PROTOCOL)
    recipe = ModelRecipe.of(model_cfg, splits.num_labels)
    return Subject(model.eval(), recipe, val, example, calibration)


@pytest.fixture
def val_data() -> TokenizedTexts:
    """48 texts of 16 random token ids, every third padded after 10, for the tiny BERT."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (48, 16), generator=generator)
    mask = torch.ones(48, 16, dtype=torch.long)
    mask[::3, 10:] = 0  # some padded examples
    return TokenizedTexts(ids, mask, torch.arange(48) % 2)


def text_example(data: TokenizedTexts) -> ExampleInputs:
    """The first text of `data` as the example a text model is exported and timed with."""
    names = ("input_ids", "attention_mask")
    dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
    return ExampleInputs((data.input_ids[:1], data.attention_mask[:1]), names, dynamic)


@pytest.fixture
def text_subject(tiny_bert, val_data) -> Subject:
    """The random-init tiny BERT to deploy, calibrated on `val_data` in batches of 16."""
    calibration = [batch.inputs for batch in val_data.batches(16)]
    return Subject(tiny_bert, TINY_BERT, val_data, text_example(val_data), calibration)


# The tiny BERT with 4 attention heads of 8 (its 32 wide), 3 of which every layer keeps: a head
# count that divides neither the width nor the heads, so nothing can assume it does.
FOUR_HEAD_BERT = ModelRecipe(
    model={**TINY_BERT.model, "config_overrides": {"num_attention_heads": 4}}, num_labels=2
)
PRUNED_BERT = ModelRecipe(model={**FOUR_HEAD_BERT.model, "num_heads": 3}, num_labels=2)


@pytest.fixture
def text_heads_subject(val_data) -> Subject:
    """`PRUNED_BERT` to deploy: the 4-head tiny BERT with the most important 3 heads of each
    layer kept, measured on `val_data`'s batches, which also calibrate."""
    from tuner.edits import apply_edits

    calibration = [batch.inputs for batch in val_data.batches(16)]
    torch.manual_seed(0)
    model = FOUR_HEAD_BERT.build()
    apply_edits(model, OmegaConf.create(PRUNED_BERT.model), calibration)
    return Subject(model, PRUNED_BERT, val_data, text_example(val_data), calibration)


def stored_sessions(user_attrs: Mapping[str, Any]) -> dict[str, list[list[list[float]]]]:
    """Latency key digest -> its measurement sessions' rounds in time order, read straight from
    a study's user attributes (`latency:<digest>:<session>`), not through the table's code."""
    found: dict[str, list[tuple[str, list[list[float]]]]] = {}
    for name, session in user_attrs.items():
        if name.startswith("latency:"):
            found.setdefault(name.split(":")[1], []).append((session["at"], session["rounds"]))
    return {digest: [rounds for _, rounds in sorted(s)] for digest, s in found.items()}


def counting_sessions(user_attrs: Mapping[str, Any]) -> dict[str, list[list[list[float]]]]:
    """Latency key digest -> the rounds of its sessions not marked unsteady (`"steady": false`),
    in time order, read straight from a study's user attributes."""
    found: dict[str, list[tuple[str, list[list[float]]]]] = {}
    for name, session in user_attrs.items():
        if name.startswith("latency:") and session.get("steady") is not False:
            found.setdefault(name.split(":")[1], []).append((session["at"], session["rounds"]))
    return {digest: [rounds for _, rounds in sorted(s)] for digest, s in found.items()}


def pooled_sessions(user_attrs: Mapping[str, Any]) -> dict[str, list[list[list[float]]]]:
    """Latency key digest -> the rounds of the sessions its latency pools, in time order: which
    sessions is the table's own rule (`LatencyTable.pooled`, checked on hand-made tables in
    test_latency_table.py). Checked here to be one of the two sets it may be: every stored
    session, or those not marked unsteady (`stored_sessions`, `counting_sessions`)."""
    from tuner.store.latency_table import LatencyTable

    table = LatencyTable.of_attrs(user_attrs)
    stored, counting = stored_sessions(user_attrs), counting_sessions(user_attrs)
    pooled = {}
    for digest in table.sessions:
        pooled[digest] = [session.rounds for session in table.pooled(digest)]
        assert pooled[digest] in (stored[digest], counting.get(digest)), digest
    return pooled


def cli_command(cwd: Path, *args: str) -> list[str]:
    """`python -m tuner ARGS` with the Optuna and MLflow stores and Hydra's outputs in `cwd`."""
    return [
        sys.executable,
        "-m",
        "tuner",
        *args,
        f"study.storage=sqlite:///{cwd}/optuna.db",
        f"tracking.uri=sqlite:///{cwd}/mlflow.db",
        f"hydra.run.dir={cwd}/outputs",
    ]


def run_cli(
    cwd: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI as a user would; options such as --config-dir go first in `args`, and
    `env` adds environment variables."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    command = cli_command(cwd, *args)
    return warm.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory) -> Path:
    """The plain smoke study, made once for the process, with its console's output in
    stdout.txt and stderr.txt. Read through `smoke_study.copy_of_study`, never in place; the
    tests that read it share the xdist group `smoke_study`, so one process makes it."""
    path = tmp_path_factory.mktemp("smoke_study")
    result = run_cli(path, *SMOKE)
    assert result.returncode == 0, result.stderr
    (path / "stdout.txt").write_text(result.stdout)
    (path / "stderr.txt").write_text(result.stderr)
    return path
