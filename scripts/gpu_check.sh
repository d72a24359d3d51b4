#!/usr/bin/env bash
# The CUDA training path on a machine with a GPU, in a few minutes:
#   bash scripts/gpu_check.sh            (from the repository root, its environment active)
# 1. what PyTorch sees (GPU model, driver, CUDA version);
# 2. the device tests (tests/test_placement.py), which on a GPU machine run the GPU cases;
# 3. the smoke studies of both experiments trained on the GPU, in fp32, bf16 and fp16
#    (`train.device=cuda`), each in a fresh directory;
# 4. a summary per study: trials complete, where each point trained, its training seconds and
#    the GPU memory it held. Exits non-zero when any step fails or a point did not train on CUDA.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

python - <<'EOF'
import subprocess, sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: PyTorch sees no CUDA GPU here; this check is for a GPU machine")
driver = subprocess.run(
    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
    capture_output=True, text=True,
).stdout.strip() or "unknown"
for index in range(torch.cuda.device_count()):
    print(f"GPU {index}: {torch.cuda.get_device_name(index)}")
print(f"driver {driver}, CUDA {torch.version.cuda}, torch {torch.__version__}")
EOF

python -m pytest -q -p no:cacheprovider "$repo/tests/test_placement.py"

studies=(
  "bert_ffn fp32"
  "bert_ffn bf16"
  "bert_ffn fp16"
  "resnet_mixup fp32"
  "resnet_mixup fp16"
)
for study in "${studies[@]}"; do
  read -r experiment precision <<<"$study"
  directory="$work/$experiment-$precision"
  mkdir -p "$directory"
  echo "== $experiment, train.precision=$precision"
  (cd "$directory" && python -m tuner "+experiment=$experiment" debug=smoke \
      train.device=cuda "train.precision=$precision")
  (cd "$directory" && python - "$experiment-$precision" <<'EOF'
import sys
import mlflow
import optuna
label = sys.argv[1]
(summary,) = optuna.get_all_study_summaries("sqlite:///optuna.db")
study = optuna.load_study(study_name=summary.study_name, storage="sqlite:///optuna.db")
complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
client = mlflow.MlflowClient("sqlite:///mlflow.db")
runs = client.search_runs(
    [client.get_experiment_by_name(summary.study_name).experiment_id],
    "tags.`train.trained_on` != ''",
)
places = sorted({run.data.tags["train.trained_on"] for run in runs})
peak = max((run.data.metrics.get("train_gpu_peak_mb", 0.0) for run in runs), default=0.0)
seconds = max((run.data.metrics.get("train_seconds", 0.0) for run in runs), default=0.0)
print(
    f"{label}: {len(complete)}/{len(study.trials)} trials complete, {len(runs)} points "
    f"trained on {', '.join(places) or 'nothing'}; longest training {seconds:.1f} s, "
    f"GPU peak {peak:.0f} MB"
)
if not complete or not runs or not all(place.startswith("cuda") for place in places):
    sys.exit(f"gpu_check: {label} did not train its points on CUDA")
EOF
  )
done
echo "gpu_check: every study trained on the GPU"
