"""Exceptions with a user-facing meaning."""

from __future__ import annotations


class ConfigError(ValueError):
    """The config, a search-space file or the data is invalid.

    Raised before the study is created or any training starts; the message names the key, file
    or value at fault and is printed as is.
    """


class TrialFailed(RuntimeError):
    """A trial cannot produce a result (e.g. its loss diverged); the study goes on."""


class StudyStopped(RuntimeError):
    """The study cannot go on (e.g. its distillation teacher failed to train); nothing recorded
    is lost, the message says why, and a later run resumes it."""
