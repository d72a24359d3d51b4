#!/usr/bin/env bash
# The CUDA paths on a machine with a GPU, in a few minutes:
#   bash scripts/gpu_check.sh            (from the repository root, its environment active)
# 1. what PyTorch sees (GPU model, driver, CUDA version);
# 2. the device tests and the backend contract, which on a GPU machine run the GPU cases
#    (tests/test_placement.py, tests/test_gpu_deploy.py, the cuda_* cases of
#    tests/test_backends.py);
# 3. the smoke studies of both experiments trained on the GPU, in fp32, bf16 and fp16
#    (`train.device=cuda`), then deployed and timed on it too (`deploy.device=cuda` with the
#    backends of search_spaces/backends_cuda.yaml), each in a fresh directory;
# 4. a summary per study: trials complete, where its points trained, training seconds and GPU
#    memory, and for the GPU-deployed ones each backend's points, latency and GPU memory.
# Exits non-zero when any step fails, a point did not train on CUDA, or a GPU backend made no
# point.
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

python -m pytest -q -p no:cacheprovider "$repo/tests/test_placement.py" \
  "$repo/tests/test_gpu_deploy.py" "$repo/tests/test_backends.py" -k "placement or gpu or cuda"

# experiment, training precision, where it deploys
studies=(
  "bert_ffn fp32 cpu"
  "bert_ffn bf16 cpu"
  "bert_ffn fp16 cpu"
  "resnet_mixup fp32 cpu"
  "resnet_mixup fp16 cpu"
  "bert_ffn fp32 cuda"
  "resnet_mixup fp32 cuda"
)
for study in "${studies[@]}"; do
  read -r experiment precision deploy <<<"$study"
  directory="$work/$experiment-$precision-$deploy"
  mkdir -p "$directory"
  deploy_args=(deploy.device=cpu)
  if [[ $deploy == cuda ]]; then
    deploy_args=(deploy.device=cuda +search_spaces@search_space=backends_cuda)
  fi
  echo "== $experiment, train.precision=$precision, deployed on $deploy"
  (cd "$directory" && python -m tuner "+experiment=$experiment" debug=smoke \
      train.device=cuda "train.precision=$precision" "${deploy_args[@]}")
  (cd "$directory" && python - "$experiment-$precision-$deploy" "$deploy" <<'EOF'
import sys
import mlflow
import optuna
label, deploy = sys.argv[1], sys.argv[2]
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
if deploy == "cuda":
    for backend in ("cuda_eager", "cuda_fp16", "cuda_bf16", "cuda_compile"):
        mine = [r for r in runs if r.data.params.get("deploy.backend") == backend]
        if not mine:
            sys.exit(f"gpu_check: {label}: no {backend} point")
        p50s = sorted(r.data.metrics["latency_ms_p50"] for r in mine)
        memory = max(r.data.metrics.get("gpu_peak_memory_mb", 0.0) for r in mine)
        print(
            f"  {backend}: {len(mine)} point(s), p50 {p50s[len(p50s) // 2]:.2f} ms, "
            f"GPU peak {memory:.0f} MB"
        )
    params = runs[0].data.params
    print(f"  timed on {params.get('latency.gpu')}, driver {params.get('latency.gpu_driver')}")
EOF
  )
done
echo "gpu_check: every study trained (and where asked, deployed) on the GPU"
