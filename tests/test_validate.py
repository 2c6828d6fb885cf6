"""Schema violations become located diagnostics with exact text. Schemas here are small and
inline, so these tests do not depend on the project's real schema files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compiler
from compiler import paths
from compiler.pipeline.load import load_yaml_text
from compiler.pipeline.validate import load_schema, validate

MODULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["layers"],
    "properties": {
        "layers": {"type": "integer", "minimum": 1},
        "hidden": {"type": "integer", "exclusiveMinimum": 0},
        "heads": {"type": "integer", "maximum": 128},
    },
}
SPEC = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "modules"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9-]+$"},
        "attention": {"enum": ["eager", "flash_attention_2", "sdpa"]},
        "optimizer": {"const": "adamw"},
        "gradient_checkpointing": {"type": "boolean"},
        "lr": {"type": "number"},
        "modules": {"type": "object", "additionalProperties": {"$ref": "#/$defs/module"}},
        "trainable": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"}},
        "batch": {"anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}]},
        "precision": {
            "oneOf": [
                {"type": "string", "enum": ["bf16", "fp32"]},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["param"],
                    "properties": {"param": {"type": "string"}, "grad": {"type": "string"}},
                },
            ]
        },
    },
    "$defs": {"module": MODULE},
}


def check(text: str, schema=SPEC, file: str = "x.yaml") -> str:
    doc = load_yaml_text(text, file)
    return "\n\n".join(d.render() for d in validate(doc, schema))


def test_valid_document_has_no_diagnostics():
    assert check("name: llava-7b\nmodules:\n  language: {layers: 32, hidden: 4096}\n") == ""


def test_unknown_key_with_suggestion():
    assert check(
        "name: m\nmodules:\n  language:\n    layers: 32\n    hiden: 4096\n"  # line 5, col 5
    ) == ("x.yaml:5:5: E203 $.modules.language.hiden: unknown key 'hiden'\nhelp: did you mean 'hidden'?")


def test_unknown_key_lists_allowed_keys_when_nothing_is_close():
    assert check("name: m\nmodules:\n  v: {layers: 1, zzz: 2}\n") == (
        "x.yaml:3:18: E203 $.modules.v.zzz: unknown key 'zzz'\nhelp: allowed keys: layers, hidden, heads"
    )


def test_missing_required_key_is_shown_at_its_mapping():
    assert check("name: m\nmodules:\n  vision:\n    hidden: 1024\n") == ("x.yaml:3:3: E201 $.modules.vision: missing required key 'layers'")


def test_missing_keys_at_the_root():
    assert check("attention: sdpa\n") == ("x.yaml:1:1: E201 $: missing required key 'name'\n\nx.yaml:1:1: E201 $: missing required key 'modules'")


@pytest.mark.parametrize(
    "value, got",
    [
        ("abc", "string 'abc'"),
        ("true", "boolean true"),  # booleans are not integers
        ("4096.0", "number 4096.0"),  # nor are floats with nothing after the point
        ("[1]", "a list"),
        ("{a: 1}", "a mapping"),
        ("null", "null"),
    ],
)
def test_type_mismatch(value, got):
    assert check(f"name: m\nmodules:\n  v:\n    layers: {value}\n") == (f"x.yaml:4:5: E202 $.modules.v.layers: expected integer, got {got}")


def test_type_names_users_know():
    assert check("name: 7\nmodules: []\nlr: fast\ngradient_checkpointing: 1\n") == (
        "x.yaml:1:1: E202 $.name: expected string, got integer 7\n"
        "\n"
        "x.yaml:2:1: E202 $.modules: expected mapping, got a list\n"
        "\n"
        "x.yaml:3:1: E202 $.lr: expected number, got string 'fast'\n"
        "\n"
        "x.yaml:4:1: E202 $.gradient_checkpointing: expected boolean, got integer 1"
    )


def test_root_type():
    assert check("- a\n") == "x.yaml:1:1: E202 $: expected mapping, got a list"


def test_bounds():
    assert check("name: m\nmodules:\n  v: {layers: -4, hidden: 0, heads: 200}\n") == (
        "x.yaml:3:7: E204 $.modules.v.layers: must be >= 1, got -4\n"
        "\n"
        "x.yaml:3:19: E204 $.modules.v.hidden: must be > 0, got 0\n"
        "\n"
        "x.yaml:3:30: E204 $.modules.v.heads: must be <= 128, got 200"
    )


def test_enum_with_suggestion():
    assert check("name: m\nmodules: {}\nattention: sdpaa\n") == (
        "x.yaml:3:1: E205 $.attention: 'sdpaa' is not one of: eager, flash_attention_2, sdpa\nhelp: did you mean 'sdpa'?"
    )


def test_const():
    assert check("name: m\nmodules: {}\noptimizer: adamv\n") == ("x.yaml:3:1: E205 $.optimizer: expected 'adamw', got 'adamv'\nhelp: did you mean 'adamw'?")


def test_pattern():
    assert check("name: Llava 7B\nmodules: {}\n") == ("x.yaml:1:1: E206 $.name: 'Llava 7B' does not match pattern '^[a-z0-9-]+$'")


def test_min_items_and_unique_items():
    assert check("name: m\nmodules: {}\ntrainable: []\n") == ("x.yaml:3:1: E207 $.trainable: must have at least 1 item(s), got 0")
    assert check("name: m\nmodules: {}\ntrainable: [a, b, a]\n") == ("x.yaml:3:19: E207 $.trainable[2]: items must be unique: 'a' appears more than once")


def test_any_of_reports_the_branch_that_fits_best():
    # the integer branch fits the value's type, so its bound is the useful message
    assert check("name: m\nmodules: {}\nbatch: -1\n") == "x.yaml:3:1: E204 $.batch: must be >= 1, got -1"
    assert check("name: m\nmodules: {}\nbatch: 8\n") == ""
    assert check("name: m\nmodules: {}\nbatch: auto\n") == ""


def test_one_of_reports_inside_the_matching_branch():
    assert check("name: m\nmodules: {}\nprecision: {param: bf16, grads: bf16}\n") == (
        "x.yaml:3:26: E203 $.precision.grads: unknown key 'grads'\nhelp: did you mean 'grad'?"
    )
    assert check("name: m\nmodules: {}\nprecision: bf17\n") == ("x.yaml:3:1: E205 $.precision: 'bf17' is not one of: bf16, fp32\nhelp: did you mean 'bf16'?")


def test_one_of_matching_twice_is_e208():
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    assert check("3\n", schema) == ("x.yaml:1:1: E208 $: 3 matches more than one of the allowed forms\nhelp: the schema's oneOf needs exactly one")


def test_other_keywords_fall_back_to_e208():
    schema = {"type": "object", "not": {"required": ["a"]}}
    assert check("a: 1\n", schema) == "x.yaml:1:1: E208 $: {'a': 1} should not be valid under {'required': ['a']}"


def test_property_names_are_reported_at_the_key():
    schema = {"type": "object", "propertyNames": {"pattern": "^[a-z_]+$"}}
    assert check("ok: 1\nBad-Key: 2\n", schema) == ("x.yaml:2:1: E206 $['Bad-Key']: key 'Bad-Key' does not match pattern '^[a-z_]+$'")


def test_all_errors_sorted_by_position_without_duplicates():
    text = (
        "nme: m\n"  # 1: unknown key; 'name' missing at $
        "modules:\n"
        "  a: {layers: 0, hidden: x}\n"  # 3: two errors
        "attention: fast\n"  # 4
    )
    out = check(text)
    assert out == (
        "x.yaml:1:1: E201 $: missing required key 'name'\n"
        "\n"
        "x.yaml:1:1: E203 $.nme: unknown key 'nme'\n"
        "help: did you mean 'name'?\n"
        "\n"
        "x.yaml:3:7: E204 $.modules.a.layers: must be >= 1, got 0\n"
        "\n"
        "x.yaml:3:18: E202 $.modules.a.hidden: expected integer, got string 'x'\n"
        "\n"
        "x.yaml:4:1: E205 $.attention: 'fast' is not one of: eager, flash_attention_2, sdpa"
    )


def test_unevaluated_properties():
    schema = {"type": "object", "allOf": [{"properties": {"alpha": {}}}], "properties": {"beta": {}}, "unevaluatedProperties": False}
    assert check("alpha: 1\nbeta: 2\nalfa: 3\nzzz: 4\n", schema) == (
        "x.yaml:3:1: E203 $.alfa: unknown key 'alfa'\nhelp: did you mean 'alpha'?\n\nx.yaml:4:1: E203 $.zzz: unknown key 'zzz'\nhelp: allowed keys: beta, alpha"
    )


# --------------------------------------------------------------------------- schema files


def write_schemas(root, schemas):
    (root / "schemas").mkdir()
    for name, schema in schemas.items():
        (root / "schemas" / f"{name}.schema.json").write_text(json.dumps(schema))


def test_ref_to_a_sibling_schema_by_id(tmp_path, monkeypatch):
    write_schemas(
        tmp_path,
        {
            "common": {"$id": "https://memspec.dev/schemas/common/v1", "$defs": {"size": {"type": "integer", "minimum": 1}}},
            "model": {
                "$id": "https://memspec.dev/schemas/model/v1",
                "type": "object",
                "properties": {"hidden": {"$ref": "https://memspec.dev/schemas/common/v1#/$defs/size"}, "heads": {"$ref": "../common/v1#/$defs/size"}},
            },
        },
    )
    monkeypatch.setattr(paths, "data_root", lambda: tmp_path)
    schema = load_schema("model")
    assert schema["$id"] == "https://memspec.dev/schemas/model/v1"
    assert check("hidden: 0\nheads: x\n", schema) == (
        "x.yaml:1:1: E204 $.hidden: must be >= 1, got 0\n\nx.yaml:2:1: E202 $.heads: expected integer, got string 'x'"
    )


def test_load_schema_reads_the_data_root(tmp_path, monkeypatch):
    write_schemas(tmp_path, {"formula": {"type": "object"}})
    monkeypatch.setattr(paths, "data_root", lambda: tmp_path)
    assert load_schema("formula") == {"type": "object"}
    assert load_schema("formula") is load_schema("formula")  # cached
    with pytest.raises(FileNotFoundError):
        load_schema("nope")


def test_data_root_is_the_checkout_without_a_bundled_copy():
    root = paths.data_root()
    assert (root / "compiler").is_dir() or root.name == "_data"
    assert paths.schema_path("spec") == root / "schemas" / "spec.schema.json"
    assert paths.formulas_dir() == root / "formulas"
    assert paths.specs_dir() == root / "specs"


def test_jsonschema_is_imported_only_when_validating():
    code = (
        "import sys, compiler.pipeline.load, compiler.pipeline.validate, compiler.errors, compiler.paths; "
        "print('jsonschema' in sys.modules, 'referencing' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(compiler.__file__).parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.split() == ["False", "False"]
