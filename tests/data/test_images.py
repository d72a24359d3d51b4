"""Image data (digits, Fashion-MNIST IDX files), the image input pipeline, timm CNNs with their
structural knobs and `auto` initialisation, and timm's mixup and cutmix."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf

from tuner.data import load_splits
from tuner.data.fashion_mnist import read_idx
from tuner.errors import ConfigError
from tuner.latency.protocol import LatencyProtocol
from tuner.modalities.image import ImageModality
from tuner.models import build_model
from tuner.training import batch_loss, initialise_new_layers
from tuner.training.image_mixup import image_mixer, mix_images

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def _data_cfg(name: str, **changes):
    return OmegaConf.merge(OmegaConf.load(REPO / "conf" / "data" / f"{name}.yaml"), changes)


def _model_cfg(**changes):
    return OmegaConf.merge(OmegaConf.load(REPO / "conf" / "model" / "resnet.yaml"), changes)


def test_digits_split_into_images_with_ten_labels():
    splits = load_splits(_data_cfg("digits"))
    assert splits.modality == "image"
    assert splits.label_names == [str(d) for d in range(10)]
    assert splits.train.items.shape[1:] == (8, 8)
    total = len(splits.train) + len(splits.val) + len(splits.test)
    assert total == 1797 and len(splits.test) == round(1797 * 0.1)


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_fashion_mnist_keeps_its_own_test_set():
    splits = load_splits(_data_cfg("fashion_mnist", max_train_samples=500, max_val_samples=100))
    assert splits.modality == "image"
    assert len(splits.label_names) == 10 and "ankle boot" in splits.label_names
    assert splits.train.items.shape == (500, 28, 28) and len(splits.val) == 100
    # The official t10k images, whole, whatever the fractions say.
    assert len(splits.test) == 10_000
    assert splits.train.items.max() > 200  # raw 0-255 pixels; normalising is the modality's job


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(
        size.to_bytes(4, "big") for size in array.shape
    )
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_are_read_and_damaged_ones_named(tmp_path):
    images = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", images)
    assert np.array_equal(read_idx(tmp_path / "a.gz", 3), images)
    with pytest.raises(ConfigError, match=r"a.gz: not an IDX file of rank 1"):
        read_idx(tmp_path / "a.gz", 1)
    truncated = tmp_path / "b.gz"
    with gzip.open(truncated, "wb") as stream:
        stream.write(bytes([0, 0, 8, 3]) + (5).to_bytes(4, "big") * 3 + b"\x00" * 7)
    with pytest.raises(ConfigError, match=r"b.gz: header says \(5, 5, 5\), found 7 values"):
        read_idx(truncated, 3)


def test_missing_fashion_mnist_names_the_debian_package(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_splits(_data_cfg("fashion_mnist", path=str(tmp_path)))
    message = str(error.value)
    assert "'data.path'" in message and "dataset-fashion-mnist" in message
    assert "train-images-idx3-ubyte" in message and str(tmp_path) in message


def _digits_modality() -> tuple[ImageModality, object]:
    splits = load_splits(_data_cfg("digits"))
    cfg = OmegaConf.create({"model": {"in_chans": 1}})
    return ImageModality.from_config(cfg, splits), splits


def test_images_are_standardised_by_the_training_split(tmp_path):
    modality, splits = _digits_modality()
    train = modality.encode(splits.train.items, splits.train.labels)
    assert train.images.shape == (len(splits.train), 1, 8, 8)
    assert abs(float(train.images.mean())) < 1e-4
    assert float(train.images.std()) == pytest.approx(1.0, abs=1e-3)
    assert train.labels.tolist() == splits.train.labels
    # Serving rebuilds the very same pipeline from what is shipped with the model.
    modality.save(tmp_path)
    again = ImageModality.load(tmp_path)
    assert torch.equal(
        again.encode(splits.val.items).images, modality.encode(splits.val.items).images
    )
    with pytest.raises(ValueError, match=r"expected images of shape \(1, 8, 8\)"):
        modality.encode(np.zeros((2, 28, 28)))
    example = modality.example(splits.val.items, LatencyProtocol(3, 128, 2, 1, 1))
    assert example.shape() == "3x1x8x8" and example.names == ("images",)


def test_model_channels_must_match_the_images():
    splits = load_splits(_data_cfg("digits"))
    with pytest.raises(ConfigError, match=r"'model.in_chans': 3, but the images of .* 1 channel"):
        ImageModality.from_config(OmegaConf.create({"model": {"in_chans": 3}}), splits)


def _convs(model) -> list[torch.nn.Conv2d]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]


def test_width_and_depth_shape_the_resnet():
    full = build_model(_model_cfg(), 10)
    slim = build_model(_model_cfg(width_multiplier=0.25, depth=1), 10)
    assert len(full.net.layer1) == 2 and len(slim.net.layer1) == 1
    assert full.net.layer4[0].conv1.out_channels == 512
    assert slim.net.layer4[0].conv1.out_channels == 128
    assert slim.net.conv1.in_channels == 1
    assert slim(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert slim(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_structural_knobs_on_other_architectures_and_unknown_names_are_refused():
    with pytest.raises(ConfigError, match=r"'mobilenetv3_small_050' comes from timm.models"):
        build_model(_model_cfg(name="mobilenetv3_small_050", width_multiplier=0.5), 10)
    # Without the knobs, any timm model builds for 1-channel input.
    assert build_model(_model_cfg(name="mobilenetv3_small_050"), 10)(
        torch.randn(2, 1, 32, 32)
    ).shape == (2, 10)
    with pytest.raises(ConfigError, match=r"'model.name': 'resnet_nonexistent' is not a timm"):
        build_model(_model_cfg(name="resnet_nonexistent"), 10)


@pytest.mark.parametrize(
    ("act_layer", "activation", "same_as"),
    [("relu", "relu", "kaiming"), ("silu", "silu", "kaiming"), ("tanh", "tanh", "xavier")],
)
def test_auto_init_follows_the_models_activation(act_layer, activation, same_as):
    cfg = _model_cfg(width_multiplier=0.25, depth=1, kwargs={"act_layer": act_layer})
    auto, explicit = build_model(cfg, 10), build_model(cfg, 10)
    assert auto.activation() == activation
    layers = auto.new_layers()
    assert {layer.activation for layer in layers} == {activation, "linear"}
    assert [layer.name for layer in layers if layer.activation == "linear"] == ["fc"]
    torch.manual_seed(0)
    initialise_new_layers(auto.new_layers(), "auto")
    torch.manual_seed(0)
    initialise_new_layers(explicit.new_layers(), same_as)
    for a, b in zip(_convs(auto), _convs(explicit), strict=True):
        assert torch.equal(a.weight, b.weight)


def _labelled_images(n: int = 6, size: int = 8):
    """Image i is filled with the value i + 1, so every pixel tells which image it came from."""
    values = torch.arange(1, n + 1, dtype=torch.float32)
    images = values.view(n, 1, 1, 1).expand(n, 1, size, size).clone()
    return images, torch.arange(n) % 3


def test_mixup_mixes_images_and_labels_by_the_same_lam():
    images, labels = _labelled_images()
    mixer = image_mixer(OmegaConf.create({"mixup_alpha": 0.4, "cutmix_alpha": 0.0}), 3)
    mixed, targets = mix_images(mixer, images, labels, torch.Generator().manual_seed(1))
    partner = images.flip(0)
    # One lam per batch, read off the first image; every image and target follows it.
    lam = float(
        (mixed[0, 0, 0, 0] - partner[0, 0, 0, 0]) / (images[0, 0, 0, 0] - partner[0, 0, 0, 0])
    )
    assert 0 <= lam <= 1
    assert torch.allclose(mixed, lam * images + (1 - lam) * partner, atol=1e-5)
    one_hot = torch.nn.functional.one_hot(labels, 3).float()
    assert torch.allclose(targets, lam * one_hot + (1 - lam) * one_hot.flip(0), atol=1e-5)
    assert torch.equal(images, _labelled_images()[0])  # the input batch is left alone


def test_cutmix_pastes_a_box_whose_area_is_the_label_weight():
    images, labels = _labelled_images(size=16)
    mixer = image_mixer(OmegaConf.create({"mixup_alpha": 0.0, "cutmix_alpha": 1.0}), 3)
    for seed in range(5):
        mixed, targets = mix_images(mixer, images, labels, torch.Generator().manual_seed(seed))
        for i in range(len(images)):
            own = mixed[i] == images[i]
            pasted = mixed[i] == images.flip(0)[i]
            assert bool((own | pasted).all())  # every pixel is the image's own or its partner's
            lam = float(own.float().mean())
            one_hot = torch.nn.functional.one_hot(labels, 3).float()
            expected = lam * one_hot[i] + (1 - lam) * one_hot.flip(0)[i]
            assert torch.allclose(targets[i], expected, atol=1e-5)


def test_image_mixing_is_reproducible_and_leaves_numpy_alone():
    images, labels = _labelled_images()
    mixer = image_mixer(OmegaConf.create({"mixup_alpha": 0.2, "cutmix_alpha": 1.0}), 3)
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    a = mix_images(mixer, images, labels, torch.Generator().manual_seed(7))
    b = mix_images(mixer, images, labels, torch.Generator().manual_seed(7))
    assert np.random.rand() == expected_next
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_image_batch_loss_handles_odd_batches():
    from tuner.data.batches import Batch

    cfg = OmegaConf.create({"mixup_alpha": 0.2, "cutmix_alpha": 1.0})
    loss_of = batch_loss("image", cfg, 3)
    model = build_model(_model_cfg(width_multiplier=0.25, depth=1), 3)
    images, labels = _labelled_images(5)
    for n in (5, 3):
        output = loss_of(
            model,
            Batch((images[:n],), labels[:n], torch.arange(n)),
            torch.Generator().manual_seed(0),
        )
        assert torch.isfinite(output.loss)
        # The odd image is left out of the mixed batch; the logits are those of the mixed ones.
        assert output.logits.shape == (n - n % 2, 3)
