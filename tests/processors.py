"""transformers' image-processing functions for the tests that check a family's resize against
them."""

from __future__ import annotations

import importlib

import pytest


def image_processing(model: str, name: str):
    """`name` from transformers' image processor of `model` (models/<model>/): the PIL module's or
    the torchvision one's, whichever imports (each needs its image library besides
    transformers); the calling test is skipped when neither does."""
    pytest.importorskip("transformers")
    for module in (f"transformers.models.{model}.image_processing_pil_{model}", f"transformers.models.{model}.image_processing_{model}"):
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError:
            continue
    pytest.skip(f"{model}'s image processor needs PIL or torchvision")
