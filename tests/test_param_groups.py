"""Optimizer parameter groups (one, or Hugging Face Trainer's decay / no-decay pair) and step
1's optimizer high-water mark: worked examples with the arithmetic beside them, on
Qwen2.5-0.5B (24 layers, hidden 896, 2 KV heads of 64: k/v biases of 128, tied 151_936 x 896
table). The measured records of specs/matrices/qwen2-param-groups.yaml check the same
figures against torch (tests/test_measured_gate.py)."""

import pytest

from compiler.api import estimate, load_inputs
from compiler.cli import main
from compiler.memory.optimizers import LAYER_NORM_CLASS, trainer_decays

QWEN = "specs/qwen2/qwen2.5-0.5b.yaml"
SMALL = dict(micro_batch=1, seq_len=1024, images_per_sample=0, trainable=["language"], attention="sdpa")
ADAMW_WD = {"type": "adamw", "impl": "foreach", "weight_decay": 0.01}
GRANULE = 512


@pytest.mark.parametrize(
    "name, module_class, decays",
    [
        ("language.layers[0].self_attn.q_proj.weight", None, True),
        ("language.layers[0].self_attn.q_proj.bias", None, False),  # r"bias"
        ("language.layers[0].input_layernorm.weight", None, False),  # r"layernorm"
        ("language.layers[0].self_attn.q_norm.weight", None, False),  # r"_norm(?:$|\.)" (Qwen3, Gemma-3)
        ("language.norm.weight", None, False),  # r"(?:^|\.)norm(?:$|\.)"
        ("language.embed_tokens.weight", None, True),
        ("vision.layers[0].layer_norm1.weight", LAYER_NORM_CLASS, False),  # CLIP: an nn.LayerNorm, by type
        ("vision.layers[0].layer_norm1.weight", None, True),  # the name alone does not say it
        ("vision.blocks[0].norm1.weight", None, True),  # Qwen2.5-VL's RMSNorm norm1 decays
        ("vision.embeddings.class_embedding", None, True),
    ],
)
def test_trainer_rule(name, module_class, decays):
    assert trainer_decays(name, module_class) is decays


def test_trainer_rule_agrees_with_transformers_on_real_modules():
    """The regexes and the LayerNorm type rule give transformers' own answer on named
    parameters of a Qwen2 and a CLIP vision model (tiny configs, meta device)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import CLIPVisionConfig, CLIPVisionModel, Qwen2Config, Qwen2ForCausalLM, Trainer

    with torch.device("meta"):
        models = [
            Qwen2ForCausalLM(
                Qwen2Config(
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    vocab_size=128,
                    tie_word_embeddings=True,
                )
            ),
            CLIPVisionModel(CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=16)),
        ]
    for model in models:
        want = set(Trainer.get_decay_parameter_names(None, model))
        owner = {f"{m}.{n}" if m else n: type(mod) for m, mod in model.named_modules() for n, _ in mod.named_parameters(recurse=False)}
        for name, _ in model.named_parameters():
            cls = LAYER_NORM_CLASS if issubclass(owner[name], torch.nn.LayerNorm) else None
            assert trainer_decays(name, cls) == (name in want), name


def _setup(**kw):
    return load_inputs(QWEN, {**SMALL, **kw})[1]


def _stepped(**kw):
    from compiler.api import evaluate, expand, spec_library
    from compiler.pipeline.walks.optimizer_step import stepped_tensors

    spec, setup = load_inputs(QWEN, {**SMALL, **kw})
    nodes = evaluate(expand(spec, setup, spec_library(spec)), setup.optimizer, setup.state_bytes, setup.master_bytes)
    return setup, nodes, stepped_tensors(nodes, setup)


def test_stepped_tensors_visit_the_tied_table_first_and_group_the_trainer_way():
    _, _, one = _stepped(precision="bf16", optimizer=ADAMW_WD)
    # 1 table + 24 layers x (7 weights + 3 biases + 2 norms) + the final norm = 290 tensors
    assert len(one) == 1 + 24 * 12 + 1 == 290
    assert (one[0].elements, one[0].shape) == (136_134_656, (151_936, 896))  # lm_head's, at embed_tokens' place
    _, _, two = _stepped(precision="bf16", optimizer={**ADAMW_WD, "param_groups": "trainer"})
    groups = [t.group for t in two]
    assert groups == sorted(groups)  # group 0 first, then group 1
    assert groups.count(0) == 1 + 24 * 7 == 169 and groups.count(1) == 24 * 5 + 1 == 121
    assert sum(t.elements for t in two if t.group == 1) == 24 * (2 * 896 + 896 + 2 * 128) + 896 == 71_552


def test_foreach_temporaries_are_the_larger_groups():
    from compiler.pipeline.walks.optimizer_step import step_temporaries

    setup, _, one = _stepped(precision="bf16-mixed", precision_mode="master-weights", optimizer=ADAMW_WD)
    setup2, _, two = _stepped(precision="bf16-mixed", precision_mode="master-weights", optimizer={**ADAMW_WD, "param_groups": "trainer"})
    a = step_temporaries(setup, one, 0)["optimizer_temporaries"]
    b = step_temporaries(setup2, two, 0)["optimizer_temporaries"]
    # The no-decay group's fp32 exp_avg_sq copies, per layer: 2 norms + q bias of 896 x 4 B =
    # 3584 B (7 granules each) + k, v biases 128 x 4 = 512 B (1 each) = 23 granules; 24 layers
    # + the final norm's 7 = 559 granules
    assert a - b == (24 * 23 + 7) * GRANULE == 286_208


@pytest.mark.parametrize("opt", [ADAMW_WD, {"type": "sgd", "impl": "foreach", "momentum": 0.9, "weight_decay": 0.01}])
def test_trainer_groups_against_one_group(opt):
    one = estimate(QWEN, **SMALL, precision="bf16-mixed", precision_mode="master-weights", optimizer=opt).estimate
    two = estimate(QWEN, **SMALL, precision="bf16-mixed", precision_mode="master-weights", optimizer={**opt, "param_groups": "trainer"}).estimate
    assert one.peak.phase == two.peak.phase == "optimizer"
    # steady: only the larger group's foreach copy (AdamW's sqrt; SGD's weight-decay add: the
    # no-decay group has none); 286_208 B as above
    assert one.peak.total - two.peak.total == 286_208
    # step 1: besides, group 1's states (AdamW: 2 x 286_208; SGD: 1 momentum buffer) are not
    # made until group 0 has stepped
    n_states = 2 if opt["type"] == "adamw" else 1
    assert two.peak.total - two.first_step.total == n_states * 286_208
    assert one.peak.total == one.first_step.total  # one group: every state is made before the step's sqrt


def test_adafactor_first_step_high_water_is_at_the_table():
    from compiler.pipeline.walks.optimizer_step import _largest_trainable, first_step_high_water

    setup, nodes, tensors = _stepped(precision="bf16", optimizer={"type": "adafactor", "momentum": 0.9})
    high, made, temp = first_step_high_water(setup, tensors, _largest_trainable(nodes, setup))
    # the table is visited first: its states exp_avg 136_134_656 x 4 = 544_538_624, row
    # 151_936 x 4 = 607_744, column 896 x 4 = 3584, RMS (0-dim) one granule of 512
    states = 544_538_624 + 607_744 + 3584 + 512
    assert made == {"language": states} and states == 545_150_464
    # its temporaries (bf16, no master): grad.float() and p.float() + update and the factored
    # product, 4 x 544_538_624, + r_factor and c_factor 607_744 + 3584
    assert temp == 4 * 544_538_624 + 607_744 + 3584 == 2_178_765_824
    assert high == states + temp
    e = estimate(QWEN, **SMALL, precision="bf16", optimizer={"type": "adafactor", "momentum": 0.9}).estimate
    # measured (qwen2-optimizers_bf16_adafactor-b0.9, step 1): 4_769_332_736 B at mul.Tensor
    assert (e.first_step.phase, e.first_step.total) == ("optimizer", 4_769_332_736)
    assert sum(sum(c.values()) for c in e.first_step.breakdown.values()) == e.first_step.total


def test_param_groups_flag_keeps_the_experiments_optimizer(tmp_path, capsys):
    code = main(
        [
            "estimate",
            QWEN,
            "--micro-batch",
            "1",
            "--seq-len",
            "1024",
            "--images-per-sample",
            "0",
            "--optimizer",
            "adafactor",
            "--param-groups",
            "trainer",
            "--format",
            "json",
        ]
    )
    import json

    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["setup"]["optimizer"] == {"type": "adafactor", "impl": "forloop", "momentum": 0.0, "param_groups": "trainer"}


def test_bad_param_groups_in_an_experiment_is_an_error(tmp_path, capsys):
    exp = tmp_path / "x.yaml"
    exp.write_text(
        f"experiment: x\nmodel: {__import__('os').path.abspath(QWEN)}\nmicro_batch: 1\nseq_len: 1024\n"
        "images_per_sample: 0\noptimizer: {type: adamw, param_groups: two}\n"
    )
    code = main(["estimate", str(exp)])
    err = capsys.readouterr().err
    assert code == 1 and "param_groups" in err and "x.yaml" in err and "Traceback" not in err


def test_an_hf_trainer_script_runs_with_the_trainers_groups(capsys):
    """--from-command: HF Trainer builds its two groups whatever the flags; memspec's own
    --param-groups wins; LLaVA's trainer (its own rule) stays one group, with a note."""
    from compiler.cli import _report, parser

    script = ["--from-command", "tests/fixtures/accelerate/launch.sh", "--images-per-sample", "0"]
    assert _report(parser().parse_args(["estimate", QWEN, *script])).setup.optimizer.param_groups == "trainer"
    assert _report(parser().parse_args(["estimate", QWEN, *script, "--param-groups", "one"])).setup.optimizer.param_groups == "one"
    capsys.readouterr()
    llava = _report(
        parser().parse_args(["estimate", "--from-command", "tests/fixtures/launch/scripts/v1_5/finetune.sh", "specs/llava/llava-1.5-7b.yaml", "--dp", "8"])
    )
    assert llava.setup.optimizer.param_groups == "one"
    assert "LLaVA's trainer groups parameters by its own rule" in capsys.readouterr().err
