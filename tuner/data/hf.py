"""Hugging Face datasets by name, where `datasets` is installed and the hub is reachable."""

from __future__ import annotations

from omegaconf import DictConfig

from tuner.data.files import table_texts
from tuner.data.sources import DATA_SOURCES, RawData
from tuner.errors import ConfigError


@DATA_SOURCES.register("hf")
def load_hf_dataset(data_cfg: DictConfig) -> RawData:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "Invalid config: key 'data.source': 'hf' needs the `datasets` package "
            "(pip install -e '.[hf-datasets]')"
        ) from None
    origin = f"hf:{data_cfg.name}" + (f"/{data_cfg.config_name}" if data_cfg.config_name else "")
    try:
        dataset = datasets.load_dataset(data_cfg.name, data_cfg.config_name, split=data_cfg.split)
    except Exception as exc:  # the hub, the network or the name: all end the same way
        raise ConfigError(
            f"Invalid config: key 'data.name': cannot load {origin} split '{data_cfg.split}': {exc}"
        ) from None
    return table_texts(dataset.to_pandas(), data_cfg, origin)
