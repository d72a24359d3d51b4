"""scikit-learn's bundled 8x8 handwritten digits (1797 images, pixel values 0-16): tiny, offline,
and quick enough for tests and `debug=smoke` runs of image experiments."""

from __future__ import annotations

from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawData


@DATA_SOURCES.register("digits")
def load_digits(data_cfg: DictConfig) -> RawData:
    from sklearn.datasets import load_digits as bundled_digits

    digits = bundled_digits()
    return RawData(
        items=digits.images.astype("float32"),
        labels=digits.target.tolist(),
        origin="sklearn.datasets.load_digits",
        modality="image",
    )
