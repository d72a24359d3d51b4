"""Passwords kept out of everything tuner writes or prints.

A storage or tracking URL may carry a password (`postgresql+psycopg://user:pw@host/db`,
`http://user:pw@host:5000`, `...?password=pw`). The process needs it to connect, but what it
records is read by others (MLflow tags, params and artifacts, logged models, exported points,
console logs), so every URL that leaves the process goes through `mask_url`, and text that may
quote one (an error message, a command line) through `mask_urls_in`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from omegaconf import DictConfig, OmegaConf
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

MASK = "***"
# libpq (and so psycopg) also takes the password as a query parameter.
_QUERY_PASSWORD = re.compile(r"([?&;]password=)[^&;#]+", re.IGNORECASE)
# A URL quoted in free text: a scheme, `://`, then anything up to whitespace or a quote, less
# the punctuation of the sentence around it (`cannot open <url>: ...`).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"]*[^\s'\".,;:)\]]")
_HTTP = ("http://", "https://")


def mask_url(url: str) -> str:
    """`url` with its password (in the userinfo or a `password=` query parameter) shown as
    `***`; a URL without one, or text that is no URL, is returned unchanged."""
    base, query = _split_query(url)
    return _mask_userinfo(base) + _QUERY_PASSWORD.sub(rf"\g<1>{MASK}", query)


def mask_urls_in(text: str) -> str:
    """`text` with the password of every URL in it masked (`mask_url`)."""
    return _URL_IN_TEXT.sub(lambda found: mask_url(found.group(0)), text)


def masked_yaml(cfg: DictConfig) -> str:
    """`OmegaConf.to_yaml(cfg)` with the password of every URL value masked; every other value,
    and the interpolations, as they are."""
    return OmegaConf.to_yaml(OmegaConf.create(_masked(OmegaConf.to_container(cfg))))


def _masked(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _masked(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_masked(value) for value in node]
    return mask_url(node) if isinstance(node, str) else node


def _split_query(url: str) -> tuple[str, str]:
    # The query is masked apart and kept as typed: SQLAlchemy would re-order and re-encode it.
    start = url.find("?", url.rfind("@") + 1)
    return (url, "") if start < 0 else (url[:start], url[start:])


def _mask_userinfo(base: str) -> str:
    if base.lower().startswith(_HTTP):
        return _mask_netloc(base)
    try:
        parsed = make_url(base)
    except (ArgumentError, ValueError):
        return _mask_netloc(base)
    # Rendered again only when there is a password to hide, so other URLs stay as typed.
    return parsed.render_as_string(hide_password=True) if parsed.password else base


def _mask_netloc(base: str) -> str:
    parts = urlsplit(base)
    if not parts.password:
        return base
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))
