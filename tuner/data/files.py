"""Local CSV or JSONL files with a text column and a label column."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
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


def _record_lines(path: Path) -> list[int] | None:
    """The line (1-based, as an editor shows it) where each data record of the file starts; a
    quoted CSV cell may span lines, and blank lines hold no record. None where the file cannot
    be read line by line as pandas read it."""
    try:
        with path.open(newline="", encoding="utf-8") as file:
            if path.suffix.lower() in (".jsonl", ".json"):
                return [number for number, line in enumerate(file, start=1) if line.strip()]
            reader = csv.reader(file, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            starts, previous = [], 0
            for record in reader:
                if record:
                    starts.append(previous + 1)
                previous = reader.line_num
            return starts[1:]  # after the header
    except (csv.Error, UnicodeError):
        return None


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

    def lines() -> Sequence[int] | None:
        found = _record_lines(path)
        return found if found is not None and len(found) == len(frame) else None

    return table_texts(frame, data_cfg, str(path), lines)


def table_texts(
    frame: pd.DataFrame,
    data_cfg: DictConfig,
    origin: str,
    lines_of: Callable[[], Sequence[int] | None] = lambda: None,
) -> RawData:
    """Pick the configured columns of a table, naming the column and file when one is wrong.

    Args:
        lines_of: the file line each row starts on, to name a bad row as an editor shows it
            (read only when a row is bad); without them rows are named by their position.
    """
    for key in ("text_column", "label_column"):
        column = data_cfg[key]
        if column not in frame.columns:
            raise ConfigError(
                f"Invalid data in {origin}: key 'data.{key}': no column '{column}' "
                f"(columns: {', '.join(map(str, frame.columns))})"
            )
    frame = frame[[data_cfg.text_column, data_cfg.label_column]].reset_index(drop=True)
    empty = [int(i) for i in frame.index[frame.isna().any(axis=1)]]
    lines = lines_of() if empty else None

    def where(row: int) -> str:
        return f"line {lines[row]}" if lines is not None else f"row {row} (counting from 0)"

    dropped = None
    if empty and not data_cfg.get("drop_empty", False):
        raise ConfigError(
            f"Invalid data in {origin}: {where(empty[0])} has an empty text or label; fill it "
            "in, or drop such rows with data.drop_empty=true"
        )
    if empty:
        shown = ", ".join(where(row) for row in empty[:10]) + (", ..." if len(empty) > 10 else "")
        rows = "row" if len(empty) == 1 else "rows"
        dropped = f"{len(empty)} {rows} with an empty text or label ({shown})"
        frame = frame.drop(index=empty)
    return RawData(
        items=frame[data_cfg.text_column].astype(str).tolist(),
        labels=frame[data_cfg.label_column].tolist(),
        origin=origin,
        dropped=dropped,
    )
