"""The knob registry (compiler/knobs.py) against what reads it: every key is the experiment
schema's, every flag is on each verb that takes a setup, and a flag's value reaches the
overrides under its key."""

import argparse

import pytest

from compiler.cli import overrides, parser
from compiler.knobs import KNOBS
from compiler.pipeline.validate import load_schema
from compiler.pipeline.vocabulary import DEFAULTS

SCHEMA = load_schema("experiment")["properties"]
PARALLEL = SCHEMA["parallel"]["properties"]
SETUP_VERBS = ("estimate", "table", "report", "fit")


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.key], ids=lambda k: k.flag)
def test_a_keyed_knob_sets_a_key_of_the_experiment_schema(knob):
    assert knob.key in SCHEMA or knob.key in PARALLEL


@pytest.mark.parametrize("knob", [k for k in KNOBS if not k.key], ids=lambda k: k.flag)
def test_a_block_knob_names_a_block_of_the_schema(knob):
    assert knob.block in SCHEMA or knob.block in PARALLEL


def test_flags_and_attributes_are_unique():
    assert len({k.flag for k in KNOBS}) == len(KNOBS)
    assert len({k.attribute for k in KNOBS}) == len(KNOBS)


@pytest.mark.parametrize("verb", SETUP_VERBS)
def test_every_verb_with_a_setup_takes_every_knob(verb):
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]
    flags = {o for a in sub._actions for o in a.option_strings}
    assert {k.flag for k in KNOBS} <= flags


def test_the_defaults_are_the_schemas():
    """DEFAULTS, which fill an experiment, say what the schema documents as each key's default."""
    for key, value in DEFAULTS.items():
        if key == "parallel":
            for sub, v in value.items():
                assert PARALLEL[sub].get("default", v) == v, sub
        elif "default" in SCHEMA[key]:
            assert SCHEMA[key]["default"] == value, key


def test_a_flag_reaches_the_overrides_under_its_key():
    args = parser().parse_args(
        [
            "estimate",
            "x.yaml",
            "--micro-batch",
            "4",
            "--zero",
            "3",
            "--no-packing",
            "--param-groups",
            "trainer",
            "--image-size",
            "448x336",
            "--trainable",
            "projector,language",
            "--transformers-version",
            "4.46.3",
            "--lora-r",
            "16",
            "--lora-targets",
            "all-linear",
        ]
    )
    out = overrides(args)
    assert out["micro_batch"] == 4 and out["zero"] == 3 and out["packing"] is False and out["param_groups"] == "trainer"
    assert out["image_size"] == [448, 336] and out["trainable"] == ["projector", "language"]
    assert out["versions"] == {"transformers": "4.46.3"} and out["lora"] == {"r": 16, "target_modules": "all-linear"}
    assert "seq_len" not in out and "dp" not in out  # a flag not given overrides nothing
