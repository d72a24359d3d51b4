"""The console quiets libraries without importing them: transformers reads its settings from
the environment when it is imported, and a setting the user gave there is kept. Each case is
a fresh process, where transformers is not imported yet."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

_QUIETED_THEN_IMPORTED = """
import sys
from tuner import console
console.quiet_libraries()
imported_by_quieting = "transformers" in sys.modules
import transformers
from transformers.utils import logging as hf_logging
print(imported_by_quieting, hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
"""


@pytest.mark.parametrize(
    ("given", "verbosity"),
    [({}, logging.ERROR), ({"TRANSFORMERS_VERBOSITY": "info"}, logging.INFO)],
    ids=["unset", "set-by-the-user"],
)
def test_transformers_is_quieted_when_it_is_imported_unless_the_user_set_it(given, verbosity):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_", "HF_HUB_"))}
    done = subprocess.run(
        [sys.executable, "-c", _QUIETED_THEN_IMPORTED],
        env={**env, **given},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", str(verbosity), "False"]
