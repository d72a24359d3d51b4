"""Local CSV or JSONL files with a text column and a label column."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawData
from tuner.errors import ConfigError

_READERS = {
    ".csv": pd.read_csv,
    ".tsv": lambda path: pd.read_csv(path, sep="\t"),
    ".jsonl": lambda path: pd.read_json(path, lines=True),
    ".json": lambda path: pd.read_json(path, lines=True),
}


@DATA_SOURCES.register("csv")
def load_table(data_cfg: DictConfig) -> RawData:
    path = Path(str(data_cfg.path)).expanduser()
    if not path.is_file():
        raise ConfigError(f"Invalid config: key 'data.path': file {path} does not exist")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(
            f"Invalid config: key 'data.path': {path} has suffix '{path.suffix}'; "
            f"expected one of {', '.join(_READERS)}"
        )
    try:
        frame = reader(path)
    except ValueError as exc:
        raise ConfigError(f"Invalid data in {path}: cannot read it: {exc}") from None
    return table_texts(frame, data_cfg, str(path))


def table_texts(frame: pd.DataFrame, data_cfg: DictConfig, origin: str) -> RawData:
    """Pick the configured columns of a table, naming the column and file when one is wrong."""
    for key in ("text_column", "label_column"):
        column = data_cfg[key]
        if column not in frame.columns:
            raise ConfigError(
                f"Invalid data in {origin}: key 'data.{key}': no column '{column}' "
                f"(columns: {', '.join(map(str, frame.columns))})"
            )
    frame = frame[[data_cfg.text_column, data_cfg.label_column]]
    empty = frame.isna().any(axis=1)
    if empty.any():
        row = int(empty.idxmax())
        raise ConfigError(f"Invalid data in {origin}: row {row} has an empty text or label")
    return RawData(
        items=frame[data_cfg.text_column].astype(str).tolist(),
        labels=frame[data_cfg.label_column].tolist(),
        origin=origin,
    )
