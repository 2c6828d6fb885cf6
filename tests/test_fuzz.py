"""Property-based fuzzing of what users hand memspec: experiments, DeepSpeed configs, launch
scripts, formula expressions and safetensors headers. Whatever the input, the answer is an
estimate (exit 0) or a diagnostic (exit 1, or 2 for the command line), never a traceback
(exit 3), never a write outside the asked path. The examples are derandomized and hypothesis
is pinned, so every machine runs the same ones for the same selection of tests (hypothesis
also draws constants from the modules loaded: the whole suite runs examples this file alone
does not), and bounded, so the file takes well under a minute.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from compiler.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen2" / "qwen2.5-0.5b.yaml"
EXPERIMENT = ROOT / "specs" / "experiments" / "llava-1.5-7b-finetune.yaml"
HUB = ROOT / "tests" / "fixtures" / "hub" / "Qwen2.5-0.5B"
KEYS = sorted(json.loads((ROOT / "schemas" / "experiment.schema.json").read_text())["properties"])

FUZZ = settings(
    max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, -1, 2**63, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["auto", "bf16", "zero3", "language", "none", "", "h100-80gb", "eager", "cpu", "nvme"])
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (0, 1, 2), err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _only(folder: Path, expected: set[str]) -> None:
    """Nothing was written beside the inputs (no stray outputs, no temporary files)."""
    assert {p.name for p in folder.iterdir()} <= expected


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(KEYS), values, max_size=3))
def test_experiments(changes, workdir, capsys):
    data = {"experiment": "fuzz", "model": str(SPEC), "micro_batch": 1, "seq_len": 256, **changes}
    path = workdir / "experiment.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    _run(["estimate", str(path)], capsys)
    _only(workdir, {"experiment.yaml"})


@FUZZ
@given(text=st.text(max_size=200))
def test_experiment_text(text, workdir, capsys):
    """Any text at all where an experiment is expected: YAML errors, anchors, tags, lists."""
    path = workdir / "experiment.yaml"
    path.write_text(text)
    _run(["estimate", str(path)], capsys)


zero = st.fixed_dictionaries(
    {},
    optional={
        "stage": values | st.sampled_from([0, 1, 2, 3]),
        "reduce_bucket_size": values | st.sampled_from(["auto", 5e8]),
        "stage3_prefetch_bucket_size": values,
        "offload_optimizer": st.dictionaries(st.sampled_from(["device", "pin_memory"]), values | st.sampled_from(["cpu", "nvme", "none"]), max_size=2),
        "offload_param": st.dictionaries(st.sampled_from(["device", "pin_memory"]), values | st.sampled_from(["cpu", "nvme", "none"]), max_size=2),
        "overlap_comm": values,
    },
)
deepspeed = (
    st.fixed_dictionaries(
        {},
        optional={
            "zero_optimization": zero | values,
            "bf16": st.dictionaries(st.just("enabled"), values | st.booleans(), max_size=1),
            "fp16": st.dictionaries(st.just("enabled"), values | st.booleans(), max_size=1),
            "train_micro_batch_size_per_gpu": values | st.integers(1, 64),
            "communication_data_type": values,
        },
    )
    | values
)


@FUZZ
@given(config=deepspeed, trailing=st.sampled_from(["", ",", "\n}", " // x"]))
def test_deepspeed_configs(config, trailing, workdir, capsys):
    path = workdir / "ds.json"
    path.write_text(json.dumps(config) + trailing)
    _run(["estimate", str(EXPERIMENT), "--deepspeed", str(path)], capsys)
    _only(workdir, {"ds.json"})


shell = st.lists(
    st.sampled_from(
        list("abc-_=. /$`'\"\\;|&<>()*{}\n")
        + [
            "--deepspeed",
            "--bf16",
            "deepspeed",
            "torchrun",
            "train.py",
            "$(touch pwned)",
            "`touch pwned`",
            "; touch pwned",
            "--per_device_train_batch_size",
            " 4",
            "--model_name_or_path",
            "ds.json",
            "\\\n",
        ]
    ),
    max_size=24,
).map("".join)


@FUZZ
@given(script=shell)
def test_launch_scripts_are_read_never_run(script, workdir, capsys):
    path = workdir / "train.sh"
    path.write_text(script)
    _run(["estimate", str(EXPERIMENT), "--from-command", str(path)], capsys)
    _only(workdir, {"train.sh"})  # `touch pwned` never ran


atoms = st.sampled_from(
    [
        "dim",
        "tokens",
        "batch",
        "seq",
        "bytes.act",
        "x_bytes",
        "grad_flows",
        "0",
        "1",
        "-1",
        "2",
        "10",
        "10 ** 10",
        "2 ** 64",
        "True",
        "'s'",
        "ceil_div(dim, 0)",
        "min(dim)",
        "max()",
    ]
)
expressions = st.recursive(
    atoms,
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "//", "%", "**", " if ", " and "]), inner).map(
        lambda t: f"({t[0]}{t[1]}{t[2]})" if t[1] != " if " else f"({t[0]} if {t[2]} else 0)"
    ),
    max_leaves=6,
)


@FUZZ
@given(expression=expressions)
def test_formula_expressions(expression, workdir, capsys):
    """A formula's transient with any arithmetic, powers that would not fit in memory
    included, checked against its examples: a diagnostic, never a hang or a traceback."""
    text = (ROOT / "formulas" / "gelu.yaml").read_text().replace('forward: "x_bytes"', f"forward: {json.dumps(expression)}")
    text = text.replace(
        "      activations: 75_497_472          # 9216 * 4096 * 2", "      activations: 75_497_472          # 9216 * 4096 * 2\n      transient_forward: 1"
    )
    (workdir / "gelu.yaml").write_text(text)
    _run(["check", str(workdir / "gelu.yaml")], capsys)


headers = st.one_of(
    st.binary(max_size=64),
    st.dictionaries(
        st.text(max_size=12),
        st.fixed_dictionaries(
            {
                "dtype": st.sampled_from(["BF16", "F32", "I8", "F8_E4M3", "XX", ""]) | st.text(max_size=4),
                "shape": st.lists(st.integers(-5, 2**62), max_size=4) | values,
                "data_offsets": st.lists(st.integers(-5, 2**62), max_size=3) | values,
            }
        ),
        max_size=3,
    ).map(lambda d: json.dumps(d).encode()),
)


@FUZZ
@given(header=headers, declared=st.sampled_from([None, 0, 7, 2**40, 2**64 - 1]), tail=st.binary(max_size=16))
def test_safetensors_headers(header, declared, tail, workdir, capsys):
    folder = workdir / "model"
    folder.mkdir(exist_ok=True)
    out = workdir / "spec.yaml"
    out.unlink(missing_ok=True)
    shutil.copy(HUB / "config.json", folder / "config.json")
    length = len(header) if declared is None else declared
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", length) + header + tail)
    code, _ = _run(["import", str(folder), "-o", str(out)], capsys)
    assert code != 0 or out.is_file()
    _only(workdir, {"model", "spec.yaml"})


accelerate = (
    st.fixed_dictionaries(
        {},
        optional={
            "distributed_type": st.sampled_from(["NO", "MULTI_GPU", "DEEPSPEED", "FSDP", "TPU", "deepspeed"]) | values,
            "mixed_precision": st.sampled_from(["no", "bf16", "fp16", "fp8"]) | values,
            "num_processes": st.integers(-2, 2**40) | values,
            "num_machines": st.integers(0, 4) | values,
            "deepspeed_config": st.fixed_dictionaries(
                {},
                optional={
                    "zero_stage": st.integers(-1, 4) | values,
                    "offload_optimizer_device": st.sampled_from(["cpu", "nvme", "none"]) | values,
                    "deepspeed_config_file": st.sampled_from(["ds.json", "/missing.json", "../../etc/passwd"]) | values,
                    "gradient_accumulation_steps": values,
                },
            )
            | values,
            "fsdp_config": st.dictionaries(st.sampled_from(["fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy", "x"]), values, max_size=3)
            | values,
        },
    )
    | values
)


@FUZZ
@given(config=accelerate)
def test_accelerate_configs(config, workdir, capsys):
    path = workdir / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    _run(["estimate", str(EXPERIMENT), "--accelerate-config", str(path)], capsys)
    _only(workdir, {"accelerate.yaml"})


CONFIG = json.loads((HUB / "config.json").read_text())


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(sorted(CONFIG) + ["model_type", "text_config", "vision_config"]), values | st.integers(-1, 2**40), max_size=3))
def test_config_json(changes, workdir, capsys):
    """config.json with any value where a number, a name or a sub-config is expected, imported
    with the real (header-only) safetensors of the model."""
    folder = workdir / "model"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(HUB, folder)
    (folder / "config.json").write_text(json.dumps({**CONFIG, **changes}))
    out = workdir / "spec.yaml"
    out.unlink(missing_ok=True)
    code, _ = _run(["import", str(folder), "-o", str(out)], capsys)
    assert code != 0 or out.is_file()
    _only(workdir, {"model", "spec.yaml"})


SPEC_DATA = yaml.safe_load(SPEC.read_text())


@FUZZ
@given(
    path=st.lists(st.sampled_from(["modules", "language", "inputs", "type", "layers", "hidden", "vocab", "heads", "model", "x"]), min_size=1, max_size=4),
    value=values | st.integers(-1, 2**40),
)
def test_model_specs(path, value, workdir, capsys):
    """A bundled model spec with one value put anywhere along a path of its keys."""
    data = json.loads(json.dumps(SPEC_DATA))
    node = data
    for key in path[:-1]:
        if not isinstance(node, dict):
            break
        node = node.setdefault(key, {}) if not isinstance(node.get(key), dict) else node[key]
    else:
        if isinstance(node, dict):
            node[path[-1]] = value
    spec = workdir / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    _run(["estimate", str(spec), "--micro-batch", "1", "--seq-len", "128"], capsys)
    _only(workdir, {"spec.yaml"})


@FUZZ
@given(name=st.text(st.sampled_from(list("abcxyz019-_./:@~ ")), min_size=1, max_size=40))
def test_hub_ids_and_names_offline(name, workdir, capsys, monkeypatch):
    """Anything named as the model: a short name, a path, a hub id, none in the (empty) cache:
    a diagnostic, without reaching the network."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(workdir / "hf-cache"))
    monkeypatch.setenv("MEMSPEC_CACHE", str(workdir / "memspec-cache"))
    _run(["estimate", name], capsys)
    _only(workdir, {"hf-cache", "memspec-cache"})


# The worst cases seen, kept whatever hypothesis draws: each ends in a diagnostic.
WORST = {
    # billion laughs: nine levels of ten aliases would expand to 10**9 strings
    "yaml-alias-bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    + "experiment: *i\n",
    "deep-nesting.yaml": "experiment: " + "[" * 5000 + "]" * 5000 + "\n",
    "huge-integer.yaml": f"experiment: x\nmodel: {SPEC}\nmicro_batch: {10**4000}\nseq_len: 128\n",
    "binary.yaml": "\x00\xff\xfe" * 100,
}


@pytest.mark.parametrize("name", sorted(WORST))
def test_worst_cases(name, workdir, capsys):
    path = workdir / name
    path.write_text(WORST[name], errors="surrogateescape")
    code, err = _run(["estimate", str(path)], capsys)
    assert code == 1 and str(path.name) in err, err
