"""The formula libraries an estimate reads, loaded once.

Contract: `library(folder, types)` is `formula.load_library(folder or the shipped formulas,
types)`, kept in memory per folder, set of layer types and working directory;
`spec_library(spec)` is the one a spec's estimate reads. Every stage may take them (`admit`
reads the formulas' `setups:`); `api` re-exports both.
"""

from __future__ import annotations

import os
from functools import lru_cache

from ..paths import formulas_dir
from .formula import Library, load_library


def library(folder: str | None = None, types: frozenset[str] | None = None) -> Library:
    """The formulas in `folder` (default: the shipped ones); with `types`, only those layer
    types and what they reach, which is all an estimate of a spec with those modules reads.
    NB: kept per working directory too, since the files' names in messages are relative to it."""
    return _library(folder, types, os.getcwd())


@lru_cache(maxsize=16)
def _library(folder: str | None, types: frozenset[str] | None, cwd: str) -> Library:
    return load_library(folder or formulas_dir(), types)


library.cache_clear = _library.cache_clear  # type: ignore[attr-defined]


def spec_library(spec) -> Library:
    """The formulas a spec's estimate can reach (a `resolve.Spec`), loaded once per set of
    module types (and peft's ModulesToSaveWrapper, which expand puts around any of them)."""
    return library(None, frozenset(m.type for m in spec.modules) | {"modules_to_save"})
