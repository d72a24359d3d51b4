"""Fashion-MNIST (Xiao et al., 2017) from its IDX files: 70,000 28x28 greyscale images of 10
clothing classes, the official 60,000/10,000 train/test split kept. Debian's
`dataset-fashion-mnist` package installs the files in /usr/share/datasets/fashion-mnist/."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawData
from tuner.errors import ConfigError

CLASSES = (
    "t-shirt/top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)
# IDX magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the rank.
_MAGIC = {1: 0x00000801, 3: 0x00000803}


def read_idx(path: Path, rank: int) -> np.ndarray:
    """An IDX file (gzip or plain) as a uint8 array of the given rank."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            data = stream.read()
    except (OSError, EOFError) as exc:
        raise ConfigError(f"Invalid data in {path}: cannot read it: {exc}") from None
    header = 4 * (rank + 1)
    magic = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if magic != _MAGIC[rank] or len(data) < header:
        raise ConfigError(f"Invalid data in {path}: not an IDX file of rank {rank}")
    shape = tuple(int.from_bytes(data[4 * i : 4 * i + 4], "big") for i in range(1, rank + 1))
    values = np.frombuffer(data, dtype=np.uint8, offset=header)
    if values.size != int(np.prod(shape)):
        raise ConfigError(
            f"Invalid data in {path}: header says {shape}, found {values.size} values"
        )
    return values.reshape(shape)


def _find(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise ConfigError(
        f"Invalid config: key 'data.path': no {stem}(.gz) in {directory}. Fashion-MNIST's IDX "
        "files come with the Debian package `dataset-fashion-mnist` "
        "(apt-get install dataset-fashion-mnist puts them in /usr/share/datasets/fashion-mnist/)"
    )


def _part(directory: Path, prefix: str) -> RawData:
    images_path = _find(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(directory, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise ConfigError(
            f"Invalid data in {directory}: {len(images)} images but {len(labels)} labels"
        )
    return RawData(
        items=images.astype(np.float32),
        labels=[CLASSES[i] for i in labels],
        origin=str(images_path),
        modality="image",
    )


@DATA_SOURCES.register("fashion_mnist")
def load_fashion_mnist(data_cfg: DictConfig) -> RawData:
    directory = Path(str(data_cfg.path)).expanduser()
    train = _part(directory, "train")
    return RawData(
        items=train.items,
        labels=train.labels,
        origin=train.origin,
        modality="image",
        test=_part(directory, "t10k"),
    )
