"""`--from-command SCRIPT` given no model: the script's --model_name_or_path names it (a LLaVA
script with --vision_tower and --mm_projector_type: the bundled spec built from those parts),
a bundled spec, a model folder or a hub id from the caches; where it came from is printed;
nothing found is E814 at the flag. Nothing here reaches the network: hub ids resolve in a
huggingface_hub cache laid out under tmp_path with offline mode on."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler.cli import _report, main, parser
from compiler.errors import MemspecError
from compiler.inputs import launch, script_model
from compiler.paths import display, specs_dir

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = "tests/fixtures/launch/scripts"
# The bundled specs as messages show them: relative in a checkout, the installed copy's path
# in a wheel install.
SPECS = display(specs_dir())
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLIP = "openai/clip-vit-large-patch14-336"
LLAVA_13B = (
    "--model_name_or_path lmsys/vicuna-13b-v1.5 --vision_tower openai/clip-vit-large-patch14-336 "
    f"--mm_projector_type mlp2x_gelu -> bundled llava-1.5-13b ({SPECS}/llava/llava-1.5-13b.yaml)"
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """Offline mode and empty caches: a lookup that would reach the network fails instead."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "memspec-cache"))
    monkeypatch.chdir(ROOT)


def _report_of(argv):
    return _report(parser().parse_args(argv))


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _same_setup(a, b):
    """Equal but for the names of the files they came from."""
    return replace(a, experiment="", file="") == replace(b, experiment="", file="")


def _script(tmp_path, text, name="train.sh") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _resolve(path: str):
    return script_model.resolve(launch.read_command(path))


# --------------------------------------------------------------------------- LLaVA's own scripts


@pytest.mark.parametrize(
    "script, experiment, line, allocated",
    [
        # the published scripts train LLaVA-1.5-13B (lmsys/vicuna-13b-v1.5); they name no GPU count,
        # so the experiments' dp and GPU are passed; allocated as in tests/golden/SUMMARY.tsv
        ("pretrain.sh", "llava-1.5-13b-pretrain", 6, 81_515_805_184),
        ("finetune.sh", "llava-1.5-13b-finetune", 6, 54_732_056_576),
    ],
)
def test_llava_scripts_alone_estimate_as_their_experiments(script, experiment, line, allocated, capsys):
    code, out, err = _run(["estimate", "--from-command", f"{LAUNCH}/v1_5/{script}", "--dp", "8", "--gpu", "a100-80gb"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"memspec estimate: llava-1.5-13b  ({SPECS}/llava/llava-1.5-13b.yaml)"
    assert lines[2] == f"from      {LAUNCH}/v1_5/{script}:{line} {LLAVA_13B}"
    assert lines[3].startswith("setup     ")
    assert f"note: model from {LAUNCH}/v1_5/{script}:{line} {LLAVA_13B}\n" in err
    assert (
        "note: llava-1.5-13b: LLaVA's train.py keeps Vicuna's 32000-token vocabulary (the scripts pass --mm_use_im_patch_token "
        "False); this spec is llava-hf's conversion, whose embed_tokens and lm_head have 32064 rows: 655_360 parameters "
        "(2 x 64 x 5120) and 0.2 % of the logits more than the script trains, a slight over-estimate\n"
    ) in err
    assert "is not read" not in err  # the flag is read, not set aside
    from_script = _report_of(["estimate", "--from-command", f"{LAUNCH}/v1_5/{script}", "--dp", "8", "--gpu", "a100-80gb"])
    from_file = _report_of(["estimate", f"specs/experiments/{experiment}.yaml"])
    assert _same_setup(from_script.setup, from_file.setup)
    assert (from_script.allocated, from_script.reserved, from_script.device) == (from_file.allocated, from_file.reserved, from_file.device)
    assert from_script.allocated == allocated


def test_a_7b_script_picks_the_7b_spec_and_its_experiment(tmp_path, capsys):
    """finetune.sh with Vicuna-7B, the brief's example: LLaVA-1.5-7B, exactly its finetune experiment."""
    (tmp_path / "scripts" / "v1_5").mkdir(parents=True)
    shutil.copy(f"{LAUNCH}/zero3.json", tmp_path / "scripts" / "zero3.json")
    text = (ROOT / LAUNCH / "v1_5" / "finetune.sh").read_text().replace("vicuna-13b-v1.5", "vicuna-7b-v1.5")
    path = _script(tmp_path / "scripts" / "v1_5", text, "finetune.sh")
    r = _report_of(["estimate", "--from-command", path, "--dp", "8", "--gpu", "a100-80gb"])
    assert r.spec.model == "llava-1.5-7b"
    assert r.spec.origin["description"] == (
        f"{path}:6 --model_name_or_path lmsys/vicuna-7b-v1.5 --vision_tower {CLIP} "
        f"--mm_projector_type mlp2x_gelu -> bundled llava-1.5-7b ({SPECS}/llava/llava-1.5-7b.yaml)"
    )
    e = _report_of(["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml"])
    assert _same_setup(r.setup, e.setup) and (r.allocated, r.device) == (e.allocated, e.device)
    assert r.allocated == 36_723_222_528  # tests/golden/SUMMARY.tsv, llava-1.5-7b-finetune
    assert "note: llava-1.5-7b: LLaVA's train.py keeps Vicuna's 32000-token vocabulary" in capsys.readouterr().err


def test_json_says_where_the_model_came_from(capsys):
    code, out, _ = _run(["estimate", "--from-command", f"{LAUNCH}/v1_5/finetune_lora.sh", "--dp", "4", "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["model"] == "llava-1.5-13b"
    assert data["model_from"] == {
        "script": f"{LAUNCH}/v1_5/finetune_lora.sh",
        "line": 7,
        "flags": {"model_name_or_path": "lmsys/vicuna-13b-v1.5", "vision_tower": CLIP, "mm_projector_type": "mlp2x_gelu"},
        "kind": "bundled",
        "file": f"{SPECS}/llava/llava-1.5-13b.yaml",
        "description": f"{LAUNCH}/v1_5/finetune_lora.sh:7 {LLAVA_13B}",
    }
    assert data["setup"]["lora"]["r"] == 128  # the script's own flags still apply


def test_a_model_file_given_too_wins_with_a_warning(capsys):
    code, out, err = _run(["estimate", "--from-command", f"{LAUNCH}/v1_5/finetune.sh", "llava-1.5-7b", "--dp", "8"], capsys)
    assert code == 0 and out.startswith("memspec estimate: llava-1.5-7b")
    assert "\nfrom " not in out and "note: model from" not in err
    assert ("warning: the model is llava-1.5-7b, the file given to memspec; the script's --model_name_or_path lmsys/vicuna-13b-v1.5 is not read") in err


# --------------------------------------------------------------------------- fit, report, sweep, table


def test_fit_says_where_the_model_came_from(capsys, monkeypatch):
    from compiler.commands import fit as fit_module
    from compiler.pipeline import render

    reports = []
    real = fit_module.fit
    monkeypatch.setattr(fit_module, "fit", lambda *a, **k: reports.append(real(*a, **k)) or reports[-1])
    code, out, _ = _run(["fit", "--from-command", f"{LAUNCH}/v1_5/finetune.sh", "--dp", "8", "--gpu", "h100-80gb"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "memspec fit: llava-1.5-13b on h100-80gb (NVIDIA H100 80GB HBM3, 79.65 GiB)"
    assert lines[1] == f"from      {LAUNCH}/v1_5/finetune.sh:6 {LLAVA_13B}"
    # NB: --format json renders the same search's report (cli._fit): rendered here, not searched again
    assert len(reports) == 1
    assert json.loads(render.fit_json(reports[0]))["model_from"]["description"] == f"{LAUNCH}/v1_5/finetune.sh:6 {LLAVA_13B}"


def test_report_page_and_json_say_where_the_model_came_from(tmp_path, capsys):
    page = tmp_path / "finetune.html"
    code, out, _ = _run(["report", "--from-command", f"{LAUNCH}/v1_5/finetune.sh", "--dp", "8", "-o", str(page), "--format", "json"], capsys)
    assert code == 0
    assert json.loads(out)["estimate"]["model_from"]["description"] == f"{LAUNCH}/v1_5/finetune.sh:6 {LLAVA_13B}"
    html = page.read_text()
    assert (f'<p class="sub">from <code data-key="model_from.description">{LAUNCH}/v1_5/finetune.sh:6 {LLAVA_13B.replace("->", "-&gt;")}</code></p>') in html


def test_sweep_and_table_take_the_scripts_model(capsys):
    code, out, _ = _run(["sweep", "--from-command", f"{LAUNCH}/v1_5/pretrain.sh", "--micro-batch", "1,2", "--quiet"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"memspec sweep: llava-1.5-13b  ({SPECS}/llava/llava-1.5-13b.yaml), 2 points"
    assert lines[1] == f"from      {LAUNCH}/v1_5/pretrain.sh:6 {LLAVA_13B}"
    code, out, _ = _run(["table", "--from-command", f"{LAUNCH}/v1_5/pretrain.sh", "--format", "tsv"], capsys)
    # the 13B language model: hidden 5120, micro-batch 32 from the script
    assert code == 0 and "\nlanguage\tllama_causal_lm\t1\tno\t" in out and "b=32 s=2048 hidden=5120" in out


def test_no_model_and_no_script_is_a_usage_error(capsys):
    code, out, err = _run(["estimate", "--micro-batch", "1", "--seq-len", "1024"], capsys)
    assert (code, out) == (2, "")
    assert err == (
        "E201 missing the model: a spec or experiment file, a short name, a hub id or a model folder\n"
        "help: give one, e.g. memspec estimate llava-1.5-7b-finetune, or --from-command SCRIPT to take the model "
        "from the script's --model_name_or_path\n"
    )


# --------------------------------------------------------------------------- bundled specs by hub id


def test_accelerate_fixture_names_a_bundled_model(capsys):
    code, out, err = _run(["estimate", "--from-command", "tests/fixtures/accelerate/launch.sh"], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"memspec estimate: Qwen2.5-0.5B  ({SPECS}/qwen2/qwen2.5-0.5b.yaml)"
    assert lines[2] == (
        f"from      tests/fixtures/accelerate/launch.sh:4 --model_name_or_path Qwen/Qwen2.5-0.5B -> bundled qwen2.5-0.5b ({SPECS}/qwen2/qwen2.5-0.5b.yaml)"
    )
    assert lines[3] == (
        "setup     micro-batch 4 x 0 image(s) | seq 1024 | bf16-mixed (FSDP2 policy on fp32 shards) | adamw foreach, Trainer's decay / no-decay groups "
        "| attention sdpa | checkpointing language | dp 8 FSDP2 (no reshard after forward, reduce fp32)"
    )
    with_spec = _report_of(["estimate", "specs/qwen2/qwen2.5-0.5b.yaml", "--from-command", "tests/fixtures/accelerate/launch.sh"])
    alone = _report_of(["estimate", "--from-command", "tests/fixtures/accelerate/launch.sh"])
    assert _same_setup(alone.setup, with_spec.setup) and alone.allocated == with_spec.allocated


@pytest.mark.parametrize(
    "value, spec",
    [
        ("Qwen/Qwen2.5-0.5B", f"{SPECS}/qwen2/qwen2.5-0.5b.yaml"),
        ("qwen/qwen2.5-0.5b", f"{SPECS}/qwen2/qwen2.5-0.5b.yaml"),  # the hub resolves ids without case
        ("llava-hf/llava-1.5-7b-hf", f"{SPECS}/llava/llava-1.5-7b.yaml"),
        # two bundled specs have this repo; the one named as the repo is meant, not -router-aux
        ("mistralai/Mixtral-8x7B-v0.1", f"{SPECS}/mixtral/mixtral-8x7b-v0.1.yaml"),
        ("qwen2.5-0.5b", f"{SPECS}/qwen2/qwen2.5-0.5b.yaml"),  # a short name
        ("Qwen2.5-0.5B", f"{SPECS}/qwen2/qwen2.5-0.5b.yaml"),  # a spec's model name
    ],
)
def test_bundled_spec_by_hub_id_model_or_short_name(tmp_path, value, spec):
    m = _resolve(_script(tmp_path, f"torchrun --nproc_per_node 8 train.py --model_name_or_path {value} --bf16\n"))
    assert (m.kind, m.file, m.line, dict(m.flags)) == ("bundled", spec, 1, {"model_name_or_path": value})
    assert m.notes == ()  # the parts note is for LLaVA scripts only


def test_a_script_variable_names_the_model(tmp_path):
    path = _script(tmp_path, "MODEL=Qwen/Qwen2.5-0.5B\ntorchrun --nproc_per_node 2 train.py \\\n    --model_name_or_path $MODEL\n")
    m = _resolve(path)
    assert m.describe() == f"{path}:3 --model_name_or_path Qwen/Qwen2.5-0.5B -> bundled qwen2.5-0.5b ({SPECS}/qwen2/qwen2.5-0.5b.yaml)"


def test_an_unset_variable_is_e812(tmp_path):
    path = _script(tmp_path, "torchrun train.py \\\n    --model_name_or_path ${MODEL}\n")
    with pytest.raises(MemspecError) as err:
        _resolve(path)
    assert err.value.render() == (
        f"{path}:2:5: E812 --model_name_or_path: is the shell variable ${{MODEL}}, whose value the script does not set\n"
        "help: write the value in the script: memspec reads the script, it does not run it"
    )


# --------------------------------------------------------------------------- folders and hub ids


def test_a_model_folder_from_the_working_directory_or_above_the_script(tmp_path, monkeypatch, capsys):
    text = "torchrun --nproc_per_node 8 train.py --model_name_or_path tests/fixtures/hub/Llama-3.2-1B --per_device_train_batch_size 2 --max_seq_length 1024 --bf16\n"
    path = _script(tmp_path, text)
    code, out, _ = _run(["estimate", "--from-command", path], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "memspec estimate: Llama-3.2-1B  (imported from tests/fixtures/hub/Llama-3.2-1B)"
    assert lines[2] == (f"from      {path}:1 --model_name_or_path tests/fixtures/hub/Llama-3.2-1B -> folder tests/fixtures/hub/Llama-3.2-1B, imported")
    folder = _report_of(["estimate", "tests/fixtures/hub/Llama-3.2-1B", "--from-command", path])
    alone = _report_of(["estimate", "--from-command", path])
    assert _same_setup(alone.setup, folder.setup) and alone.allocated == folder.allocated
    assert (alone.setup.micro_batch, alone.setup.seq_len, alone.setup.dp) == (2, 1024, 8)
    # run from another folder: the model folder is found above the script, as from its repo root
    repo = (tmp_path / "repo").resolve()
    shutil.copytree(ROOT / "tests/fixtures/hub/Llama-3.2-1B", repo / "models" / "tiny")
    (repo / "scripts").mkdir()
    (tmp_path / "elsewhere").mkdir()
    nested = _script(repo / "scripts", "torchrun train.py --model_name_or_path models/tiny\n")
    monkeypatch.chdir(tmp_path / "elsewhere")
    m = _resolve(nested)
    assert (m.kind, m.file, m.target) == ("folder", f"{repo}/models/tiny", f"folder {repo}/models/tiny, imported")


def test_a_home_relative_folder(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "tests/fixtures/hub/Llama-3.2-1B", tmp_path / "models" / "tiny")
    monkeypatch.setenv("HOME", str(tmp_path))
    m = _resolve(_script(tmp_path, "python train.py --model_name_or_path ~/models/tiny\n"))
    assert (m.kind, m.file, dict(m.flags)) == ("folder", f"{tmp_path}/models/tiny", {"model_name_or_path": "~/models/tiny"})


def test_two_bundled_specs_of_one_repo_without_a_namesake_are_e111(tmp_path, monkeypatch):
    from compiler.commands import catalog

    a, b = (catalog.Entry(n, "spec", ROOT / f"specs/x/{n}.yaml", n, 1, ("language",), "", {"repo": "acme/m"}) for n in ("m-a", "m-b"))
    monkeypatch.setattr(catalog, "entries", lambda: (a, b))
    with pytest.raises(MemspecError) as err:
        _resolve(_script(tmp_path, "python train.py --model_name_or_path acme/m\n"))
    assert err.value.render() == (
        "E111 'acme/m' names 2 bundled specs: specs/x/m-a.yaml, specs/x/m-b.yaml\nhelp: give the path of the one you mean after the script"
    )


def test_a_hub_id_from_the_cache(tmp_path, capsys):
    from huggingface_hub import constants

    hf.hub_cache(Path(constants.HF_HUB_CACHE), "meta-llama/Llama-3.2-1B", "Llama-3.2-1B", COMMIT)
    path = _script(
        tmp_path,
        "torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-3.2-1B --per_device_train_batch_size 2 --max_seq_length 1024 --bf16\n",
    )
    code, out, _ = _run(["estimate", "--from-command", path, "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["model_from"]["kind"] == "hub"
    assert data["model_from"]["description"] == (
        f"{path}:1 --model_name_or_path meta-llama/Llama-3.2-1B -> hub id meta-llama/Llama-3.2-1B, imported at revision {COMMIT}"
    )
    folder = _report_of(["estimate", "tests/fixtures/hub/Llama-3.2-1B", "--from-command", path])
    assert data["peak"]["allocated"] == folder.allocated


def test_a_hub_id_not_cached_offline_is_e814(tmp_path, capsys):
    path = _script(tmp_path, "torchrun train.py \\\n    --model_name_or_path acme/never-published-7b \\\n    --bf16\n")
    code, out, err = _run(["estimate", "--from-command", path], capsys)
    assert (code, out) == (1, "")
    assert err == (
        f"{path}:2:5: E814 --model_name_or_path: acme/never-published-7b is no model folder (neither "
        f"{ROOT}/acme/never-published-7b nor one below a folder above the script), no bundled spec's hub id, model or short name, "
        "and a hub id memspec cannot read (repo 'acme/never-published-7b', revision 'main': config.json is not in the local "
        "cache and HF_HUB_OFFLINE is set)\n"
        "  |\n"
        "2 |     --model_name_or_path acme/never-published-7b \\\n"
        "  |     ^\n"
        f"help: name the model after the script (--from-command {path} MODEL): a spec or experiment file, a short name from "
        "'memspec list', a model folder or a hub id\n"
    )


def test_a_found_model_that_cannot_be_imported_keeps_its_own_error(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "not-a-family"}')
    path = _script(tmp_path, f"python train.py --model_name_or_path {folder}\n")
    with pytest.raises(MemspecError) as err:
        _resolve(path)
    assert [d.code for d in err.value.diagnostics] == ["E708"]


def test_a_llava_script_with_a_language_model_folder_is_not_composed(tmp_path):
    path = _script(
        tmp_path, f"deepspeed llava/train/train.py --model_name_or_path tests/fixtures/hub/Llama-3.2-1B --vision_tower {CLIP} --mm_projector_type mlp2x_gelu\n"
    )
    with pytest.raises(MemspecError) as err:
        _resolve(path)
    (d,) = err.value.diagnostics
    assert (d.code, d.line, d.path) == ("E814", 1, "--model_name_or_path")
    assert d.message.startswith(
        f"tests/fixtures/hub/Llama-3.2-1B with --vision_tower {CLIP} and --mm_projector_type mlp2x_gelu: "
        "no bundled spec is built from these parts (bundled: llava-1.5-13b: lmsys/vicuna-13b-v1.5, "
    )
    assert d.message.endswith("memspec does not compose a LLaVA model from a language model and a vision tower")


# --------------------------------------------------------------------------- the documented commands


def _documented():
    from test_docs import COMMANDS

    return [(page, command) for page, command in COMMANDS if "--from-command" in command]


@pytest.mark.parametrize("page, command", _documented(), ids=[f"{p}:{c[8:60]}" for p, c in _documented()])
def test_documented_from_command_lines_run(page, command, tmp_path, capsys):
    """Every `--from-command` line of the guides and the README runs as written (a page -o
    goes to tmp_path)."""
    import shlex

    words = shlex.split(command, comments=True)[1:]
    if "-o" in words:
        words[words.index("-o") + 1] = str(tmp_path / words[words.index("-o") + 1])
    code, out, err = _run(words, capsys)
    assert code == 0, f"{page}: '{command}' exits {code}: {err}"
    if parser().parse_args(words).file is None:  # no model file: the script's model, and where it came from
        assert "note: model from " in err
    else:
        assert "note: model from " not in err
