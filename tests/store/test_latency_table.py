"""The latency protocol's rounds, and the study's latency table: keys, sessions, sharing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import optuna
import pytest
import warm
from conftest import REPO, TINY_BERT
from omegaconf import OmegaConf

from tuner.data.batches import ExampleInputs
from tuner.errors import ConfigError
from tuner.front.points import study_points
from tuner.keys import LATENCY_KEY_ATTR, SETTINGS_ATTR
from tuner.latency.protocol import LatencyProtocol, LatencyResult, objective_name, time_rounds
from tuner.store.latency_table import (
    LatencyTable,
    digest_of,
    latency_key,
    measured_alike,
    record_session,
    stored_key,
    structure_of,
)
from tuner.store.optuna_compat import study_id_of

PROTOCOL_RECORD = {"latency.seq_len": 16, "latency.cpu": "test CPU", "latency.cpu_flags": "avx2"}
DEPLOY = OmegaConf.create(
    {"backend": "eager", "latency": {"repeats": 3}, "onnx": {"opset": 17}, "compile": {}}
)


def test_latency_of_rounds_is_the_median_of_round_medians():
    result = LatencyResult.of_rounds([[1, 2, 3], [4, 5, 6], [10, 11, 12]])
    # Round medians 2, 5, 11: their median is 5; quartiles 3.5 and 8 (linear) give an
    # interquartile range of 4.5, 90% of 5. The 95th percentile of the nine calls (sorted
    # 1..6, 10, 11, 12) lies 0.6 of the way from 11 to 12.
    assert result.p50_ms == 5
    assert result.spread_pct == pytest.approx(90.0)
    assert result.p95_ms == pytest.approx(11.6)
    assert result.rounds == 3 and result.min_ms == 1 and result.max_ms == 12


def test_one_round_has_no_spread():
    result = LatencyResult.of_rounds([[3, 1, 2]])
    assert (result.p50_ms, result.spread_pct, result.rounds) == (2, 0.0, 1)


def test_a_latency_is_ranked_by_the_statistic_the_study_chose():
    result = LatencyResult.of_rounds([[3, 1, 2], [9, 5, 7]])
    # Round medians 2 and 7, whose median is 4.5; the fastest of the six calls took 1.
    assert result.ranked_ms("p50") == 4.5 and result.ranked_ms("min") == 1
    with pytest.raises(ConfigError, match="key 'deploy.latency.statistic': unknown value 'mean'"):
        result.ranked_ms("mean")
    assert objective_name("min") == "latency_ms_min"
    # The table ranks by the study's stored statistic; a study made before there was one (no
    # such setting, or no settings at all) by p50, as it always did.
    stored = {SETTINGS_ATTR: {"deploy.latency.statistic": "min", "data.split_seed": 0}}
    assert LatencyTable.of_attrs(stored).statistic == "min"
    assert LatencyTable.of_attrs({SETTINGS_ATTR: {"data.split_seed": 0}}).statistic == "p50"
    assert LatencyTable.of_attrs({}).statistic == "p50"


def test_the_front_is_drawn_by_the_study_s_statistic(tmp_path):
    # Model A (0.90) timed [5, 12, 12]: p50 12, fastest call 5. Model B (0.80) timed [8, 8, 8]:
    # 8 either way. By p50 each is on the front (B is faster); by the fastest call A is both
    # faster and more accurate, and B is dominated.
    storage, study_id = _storage(tmp_path / "s.db")
    study = optuna.load_study(study_name="s", storage=storage)
    for name, accuracy, calls in (("a", 0.90, [5.0, 12.0, 12.0]), ("b", 0.80, [8.0, 8.0, 8.0])):
        key = latency_key(_model(name=name), STRUCTURE, "eager", DEPLOY, PROTOCOL_RECORD)
        record_session(storage, study_id, key, [calls])
        study.add_trial(
            optuna.trial.create_trial(
                values=[accuracy, calls[1]],
                user_attrs={"deploy.backend": "eager", LATENCY_KEY_ATTR: digest_of(key)},
            )
        )
    by_p50 = study_points(study)
    assert [(p.latency_ms, p.pareto, p.latency_statistic) for p in by_p50] == [
        (12.0, True, "p50"),
        (8.0, True, "p50"),
    ]
    study.set_user_attr(SETTINGS_ATTR, {"deploy.latency.statistic": "min"})
    by_fastest = study_points(study)
    assert [(p.latency_ms, p.pareto, p.latency_statistic) for p in by_fastest] == [
        (5.0, True, "min"),
        (8.0, False, "min"),
    ]


def test_rounds_interleave_the_backends():
    calls: list[str] = []

    def recorder(name):
        def call(*_):
            calls.append(name)

        return call

    protocol = LatencyProtocol(1, 16, 1, warmup=1, repeats=4, rounds=2, max_rounds=2)
    example = ExampleInputs((), (), {})
    timings = time_rounds({"a": recorder("a"), "b": recorder("b")}, example, protocol).rounds
    # Warm-up once each; then per round each in turn, 4 // 2 timed calls, with one untimed
    # call before each later round.
    assert "".join(calls) == "ab" + "aabb" + "aaabbb"
    assert [len(r) for r in timings["a"]] == [2, 2] and [len(r) for r in timings["b"]] == [2, 2]


def _model(**changes):
    return OmegaConf.create(
        {
            "family": "hf_encoder",
            "ffn_width": None,
            "num_layers": None,
            "ffn_width_fraction": None,
            "num_layers_fraction": None,
            "dropout": 0.1,
            "random_init": False,
            **changes,
        }
    )


# A model's tensors as `structure_of` lists them: what the key holds of the built architecture.
STRUCTURE = [["encoder.weight", [8, 4], "torch.float32"], ["encoder.bias", [8], "torch.float32"]]


def _digest(model, structure=STRUCTURE, backend="eager", deploy=DEPLOY, record=PROTOCOL_RECORD):
    return digest_of(latency_key(model, structure, backend, deploy, record))


def _built(recipe, **sizes):
    """`recipe`'s model config with `sizes` set, and the structure of the model it builds."""
    from dataclasses import replace

    model_cfg = OmegaConf.merge(OmegaConf.create(recipe.model), sizes)
    built = replace(recipe, model=OmegaConf.to_container(model_cfg)).build()
    return model_cfg, structure_of(built)


def test_a_relative_edit_and_the_absolute_width_it_stands_for_share_a_key():
    # The tiny BERT's FFNs are 1536 wide: half of them is 768.
    relative = _digest(*_built(TINY_BERT, ffn_width_fraction=0.5))
    assert relative == _digest(*_built(TINY_BERT, ffn_width=768))
    assert relative != _digest(*_built(TINY_BERT, ffn_width=512))
    # Unedited, and edited to the full width and depth: one architecture, one key.
    unedited = _digest(*_built(TINY_BERT))
    assert unedited == _digest(*_built(TINY_BERT, ffn_width=1536, num_layers=2)) != relative
    assert unedited != _digest(*_built(TINY_BERT, num_layers=1))


def test_the_unedited_cnn_and_a_student_of_its_full_size_share_a_key():
    from tuner.models.recipe import ModelRecipe

    recipe = ModelRecipe(
        model=OmegaConf.to_container(OmegaConf.load(REPO / "conf/model/resnet.yaml")),
        num_labels=10,
    )
    # resnet18 has two blocks per stage at full width: null sizes and 1.0 and 2 build it alike.
    unedited = _digest(*_built(recipe))
    assert unedited == _digest(*_built(recipe, width_multiplier=1.0, depth=2))
    assert unedited != _digest(*_built(recipe, width_multiplier=0.5, depth=2))
    assert unedited != _digest(*_built(recipe, depth=1))
    # Another architecture with the same sizes is another key.
    assert unedited != _digest(*_built(recipe, name="resnet18d"))


def test_what_does_not_change_the_timed_graph_is_not_in_the_key():
    base = _digest(_model())
    assert _digest(_model(dropout=0.3, random_init=True)) == base
    # The backend being chosen and the latency protocol's own node are keyed elsewhere.
    assert _digest(_model(), deploy=OmegaConf.merge(DEPLOY, {"backend": "onnxruntime"})) == base
    # The device kind is the backend's own, and a GPU's model is in the protocol record: CPU
    # keys stay what they were before studies could deploy on a GPU.
    assert _digest(_model(), deploy=OmegaConf.merge(DEPLOY, {"device": "cpu"})) == base
    # How the rounds are summarised is read from the study, not the key: the rounds are kept.
    assert _digest(_model(), record={**PROTOCOL_RECORD, "latency.statistic": "min"}) == base
    # Which timed rounds are kept as steady: they measure the same latency.
    steady = {"latency.steady_within": None, "latency.steady_attempts": 5}
    assert _digest(_model(), record={**PROTOCOL_RECORD, **steady}) == base


def test_backend_settings_protocol_and_machine_are_in_the_key():
    base = _digest(_model())
    assert _digest(_model(), backend="onnxruntime") != base
    assert _digest(_model(), deploy=OmegaConf.merge(DEPLOY, {"onnx": {"opset": 18}})) != base
    spinning = OmegaConf.merge(DEPLOY, {"onnx": {"allow_spinning": True}})
    assert _digest(_model(), deploy=spinning) != base
    assert _digest(_model(), record={**PROTOCOL_RECORD, "latency.seq_len": 32}) != base
    assert _digest(_model(), record={**PROTOCOL_RECORD, "latency.cpu_flags": "avx512f"}) != base


def _storage(path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"] * 2)
    return storage, study_id_of(study)


def test_caps_on_pytorch_s_kernels_are_part_of_the_key_only_where_set(monkeypatch):
    from tuner.latency.protocol import LatencyProtocol

    protocol = LatencyProtocol(batch_size=1, seq_len=16, num_threads=1, warmup=1, repeats=3)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    plain = protocol.record("latency.")
    # Uncapped, the record is as it was before caps were recorded: the keys stay the same.
    assert not any("cap" in key for key in plain)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    capped = protocol.record("latency.")
    assert capped == {
        **plain,
        "latency.kernel_caps": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "default"},
    }
    # Readings taken under caps never pool with uncapped ones of the same architecture.
    key = latency_key(_model(), STRUCTURE, "eager", DEPLOY, plain)
    assert not measured_alike(key, DEPLOY, capped)
    assert measured_alike(key, DEPLOY, plain)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # oneDNN's own word for no cap
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert protocol.record("latency.") == plain


def test_sessions_of_one_key_pool_their_rounds_in_time_order(tmp_path):
    storage, study_id = _storage(tmp_path / "a.db")
    key = latency_key(_model(), STRUCTURE, "eager", DEPLOY, PROTOCOL_RECORD)
    other = latency_key(_model(), STRUCTURE, "onnxruntime", DEPLOY, PROTOCOL_RECORD)
    table = LatencyTable.of_study(storage, study_id)
    assert table.result(digest_of(key)) is None and table.round_count(digest_of(key)) == 0
    record_session(storage, study_id, key, [[4.0, 4.0], [6.0, 6.0]])
    record_session(storage, study_id, other, [[1.0]])
    record_session(storage, study_id, key, [[5.0, 5.0]])
    table = LatencyTable.of_study(storage, study_id)
    assert table.rounds[digest_of(key)] == [[4.0, 4.0], [6.0, 6.0], [5.0, 5.0]]
    assert table.result(digest_of(key)).p50_ms == 5.0
    assert table.result(digest_of(other)).p50_ms == 1.0
    # Two sessions of the key, one of the other; a session added in memory counts as one more.
    assert [table.session_count(digest_of(k)) for k in (key, other)] == [2, 1]
    assert table.session_count("unmeasured") == 0
    grown = table.adding(digest_of(other), [[2.0], [3.0]])
    assert grown.session_count(digest_of(other)) == 2 and grown.round_count(digest_of(other)) == 3


def test_a_key_s_latency_leaves_out_sessions_of_too_few_steady_rounds(tmp_path):
    storage, study_id = _storage(tmp_path / "a.db")
    key = latency_key(_model(), STRUCTURE, "eager", DEPLOY, PROTOCOL_RECORD)
    spell = latency_key(_model(), STRUCTURE, "onnxruntime", DEPLOY, PROTOCOL_RECORD)
    # The key: an unsteady session (a slow spell), a steady one, one not judged.
    record_session(storage, study_id, key, [[10.0, 10.0]], steady=False)
    record_session(storage, study_id, key, [[4.0, 4.0], [6.0, 6.0]], steady=True)
    record_session(storage, study_id, key, [[5.0, 5.0]])
    # The other key found too few steady rounds in each of its sessions.
    record_session(storage, study_id, spell, [[9.0, 9.0]], steady=False)
    record_session(storage, study_id, spell, [[7.0, 7.0], [8.0, 8.0]], steady=False)
    attrs = storage.get_study_user_attrs(study_id)
    flags = sorted(
        (s["at"], s.get("steady", "absent")) for n, s in attrs.items() if n.startswith("latency:")
    )
    assert [flag for _, flag in flags] == [False, True, "absent", False, False]
    table = LatencyTable.of_study(storage, study_id)
    # The round medians that count: 4, 6 (steady) and 5 (not judged); three rounds outweigh
    # the unsteady session's one, whose 10 is left out.
    result = table.result(digest_of(key))
    assert (result.p50_ms, result.rounds, result.max_ms) == (5.0, 3, 6.0)
    assert table.round_count(digest_of(key)) == 4 and table.session_count(digest_of(key)) == 3
    assert table.counted_session_count(digest_of(key)) == 2
    # With no session that counts, every session is pooled: medians 9, 7, 8.
    assert table.result(digest_of(spell)).p50_ms == 8.0
    assert table.counted_session_count(digest_of(spell)) == 0
    # One steady round (a later trial's added one) does not outweigh a 2-round session: still
    # every session (medians 9, 7, 8, 3), and no session counted.
    one = table.adding(digest_of(spell), [[3.0, 3.0]], steady=True)
    assert one.result(digest_of(spell)).p50_ms == 7.5
    assert one.counted_session_count(digest_of(spell)) == 0
    # Two steady rounds do: then they are all the latency rests on.
    two = table.adding(digest_of(spell), [[3.0, 3.0], [2.0, 2.0]], steady=True)
    assert two.result(digest_of(spell)).p50_ms == 2.5
    assert two.counted_session_count(digest_of(spell)) == 1
    # And an unsteady one does not move a latency that rests on steady sessions.
    assert table.adding(digest_of(key), [[50.0]], steady=False).result(digest_of(key)) == result


def test_a_stored_key_is_measured_alike_under_the_same_deploy_settings_and_machine(tmp_path):
    storage, study_id = _storage(tmp_path / "a.db")
    key = latency_key(_model(), STRUCTURE, "eager", DEPLOY, PROTOCOL_RECORD)
    record_session(storage, study_id, key, [[1.0]])
    stored = stored_key(storage.get_study_user_attrs(study_id), digest_of(key))
    assert stored is not None
    assert measured_alike(stored, DEPLOY, PROTOCOL_RECORD)
    # How far a measurement grows is no part of it; another opset or CPU is.
    assert measured_alike(stored, DEPLOY, {**PROTOCOL_RECORD, "latency.max_rounds": 99})
    other_opset = OmegaConf.merge(DEPLOY, {"onnx": {"opset": 16}})
    assert not measured_alike(stored, other_opset, PROTOCOL_RECORD)
    assert not measured_alike(stored, DEPLOY, {**PROTOCOL_RECORD, "latency.cpu": "another"})
    assert not measured_alike(None, DEPLOY, PROTOCOL_RECORD)


_WRITER = """
import sys, time, optuna
from pathlib import Path
from omegaconf import OmegaConf
from tuner.store import latency_key, record_session
storage = optuna.storages.RDBStorage(sys.argv[1])
study_id = storage.get_study_id_from_name("s")
key = latency_key(OmegaConf.create({"family": "timm"}), [], "eager", OmegaConf.create({}), {})
barrier, me, other = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
values = sys.argv[5:]
# Ready, then blocked until the test lets both writers go at once.
(barrier / f"ready-{me}").write_text(me)
while not (barrier / "go").exists():
    time.sleep(0.001)
record_session(storage, study_id, key, [[float(values[0])]])
(barrier / f"wrote-{me}").touch()
# The rest only once the other writer has written too: their sessions interleave.
while not (barrier / f"wrote-{other}").exists():
    time.sleep(0.001)
for value in values[1:]:
    record_session(storage, study_id, key, [[float(value)]])
"""


def test_two_processes_on_one_storage_share_the_table_and_lose_no_session(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    storage, study_id = _storage(tmp_path / "shared.db")
    writes = {"a": [str(v) for v in range(1, 11)], "b": [str(v) for v in range(11, 21)]}
    workers = {
        me: warm.Popen([sys.executable, "-c", _WRITER, url, str(tmp_path), me, other, *writes[me]])
        for me, other in (("a", "b"), ("b", "a"))
    }
    # Both started (their imports and connections done) and blocked: released together.
    warm.wait_for_files(tmp_path / "ready-a", tmp_path / "ready-b", what="both writers were ready")
    (tmp_path / "go").touch()
    assert [worker.wait(timeout=120) for worker in workers.values()] == [0, 0]
    key = latency_key(OmegaConf.create({"family": "timm"}), [], "eager", OmegaConf.create({}), {})
    table = LatencyTable.of_study(storage, study_id)
    # Twenty one-call rounds from two writers: none overwrote another's session.
    assert sorted(r[0] for r in table.rounds[digest_of(key)]) == list(range(1, 21))
    assert table.result(digest_of(key)).p50_ms == 10.5
    assert table.session_count(digest_of(key)) == 20
    # And they wrote at the same time: in time order, the writers' sessions interleave.
    sessions = [s for n, s in storage.get_study_user_attrs(study_id).items() if "latency:" in n]
    writer = {str(worker.pid): me for me, worker in workers.items()}
    by_time = sorted(sessions, key=lambda s: s["at"])
    order = "".join(writer[s["worker"].rsplit(":", 1)[1]] for s in by_time)
    assert sorted(order[:2]) == ["a", "b"] and order.count("a") == order.count("b") == 10


_DIES_WRITING = """
import os, sys, time, optuna, sqlalchemy
from pathlib import Path
from omegaconf import OmegaConf
from tuner.store import latency_key, record_session
key = latency_key(OmegaConf.create({"family": "timm"}), [], "eager", OmegaConf.create({}), {})


def write(url, marker, kill_at):
    storage = optuna.storages.RDBStorage(url)
    study_id = storage.get_study_id_from_name("s")
    commits = []

    def before_commit(conn):
        # The KILL_AT-th commit of the write: its statements ran, it is not yet committed.
        commits.append(conn)
        if len(commits) == kill_at:
            marker.write_text(str(os.getpid()))
            time.sleep(60)

    sqlalchemy.event.listen(storage.engine, "commit", before_commit)
    record_session(storage, study_id, key, [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [4.0, 4.5]])


# One writer process per kill point, forked once this one has imported everything.
writers = {}
for kill_at, url in enumerate(sys.argv[2:], start=1):
    pid = os.fork()
    if pid == 0:
        write(url, Path(sys.argv[1]) / f"writing-{kill_at}", kill_at)
        (Path(sys.argv[1]) / f"done-{kill_at}").write_text("done")
        os._exit(0)
    writers[kill_at] = pid
for kill_at, pid in writers.items():
    print(kill_at, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_a_worker_killed_while_writing_its_session_leaves_nothing_half_done(tmp_path):
    # A writer killed as each commit of `record_session` is about to land (the key it stands
    # for, then the session), and one left alone past the last: each on a storage of its own.
    stores = {kill_at: _storage(tmp_path / f"{kill_at}.db") for kill_at in (1, 2, 3)}
    urls = [f"sqlite:///{tmp_path / f'{kill_at}.db'}" for kill_at in stores]
    worker = warm.Popen(
        [sys.executable, "-c", _DIES_WRITING, str(tmp_path), *urls],
        stdout=subprocess.PIPE,
        text=True,
    )
    killed = {}
    for kill_at in stores:
        marker, done = tmp_path / f"writing-{kill_at}", tmp_path / f"done-{kill_at}"
        warm.wait_for_files(
            marker, done, processes=[worker], what=f"writer {kill_at} ended", any_of=True
        )
        killed[kill_at] = marker.exists()
        if killed[kill_at]:
            os.kill(int(marker.read_text()), signal.SIGKILL)
    out, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0
    key = latency_key(OmegaConf.create({"family": "timm"}), [], "eager", OmegaConf.create({}), {})
    whole = {digest_of(key): [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [4.0, 4.5]]}
    found = {}
    for kill_at, (storage, study_id) in stores.items():
        attrs = storage.get_study_user_attrs(study_id)
        rounds = LatencyTable.of_attrs(attrs).rounds
        # Wherever the kill landed, the session is all there or not there at all.
        assert rounds in ({}, whole), f"killed at commit {kill_at}: {rounds}"
        found[kill_at] = (stored_key(attrs, digest_of(key)) is not None, rounds)
    # Two commits, killed in: the third writer found no third one and wrote through.
    assert killed == {1: True, 2: True, 3: False}
    assert out.splitlines() == [f"1 {-signal.SIGKILL}", f"2 {-signal.SIGKILL}", "3 0"]
    # Killed before the first commit, nothing; before the second, the key is written and its
    # session, inserted but not committed, is not.
    assert found == {1: (False, {}), 2: (True, {}), 3: (True, whole)}
    # A storage left by a kill in the write takes the next session as the key's only one.
    storage, study_id = stores[2]
    record_session(storage, study_id, key, [[3.0, 5.0]])
    assert LatencyTable.of_study(storage, study_id).rounds == {digest_of(key): [[3.0, 5.0]]}
