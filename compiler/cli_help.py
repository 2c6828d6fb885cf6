"""The examples each verb's --help prints under its options (argparse epilogs), and the words the
file argument's help shares; tests/test_cli_help.py checks that every verb has its examples."""

MAIN_EXAMPLES = """examples:
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb
  memspec sweep meta-llama/Llama-2-7b-hf --micro-batch 1,2,4 --seq-len 2048,4096 --gpu h100-80gb
  memspec diff --format markdown

`memspec COMMAND --help` shows each command's flags and examples; every command that prints
results takes --format json. Guides: docs/README.md.
"""
ESTIMATE_EXAMPLES = """examples:
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml
  memspec estimate specs/llava/llava-1.5-7b.yaml --micro-batch 8 --seq-len 2048 \\
      --trainable projector,language --zero 2 --dp 8 --gpu h100-80gb
  memspec estimate specs/experiments/llava-1.5-7b-pretrain.yaml --format json
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --optimizer paged_adamw_8bit
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --optimizer adafactor --precision bf16
  memspec estimate specs/qwen2/qwen2.5-0.5b.yaml --micro-batch 1 --seq-len 1024 --images-per-sample 0 \\
      --optimizer sgd --weight-decay 0.01 --param-groups trainer   # HF Trainer's decay / no-decay groups
  memspec estimate specs/qwen2/qwen2.5-0.5b.yaml --micro-batch 4 --seq-len 4096 --images-per-sample 0 \
      --loss fused_linear_cross_entropy --packing --activation-offloading
  memspec estimate specs/qwen3/qwen3-8b.yaml --micro-batch 1 --seq-len 4096 --tp 8 --sp --pp 4
  memspec estimate meta-llama/Llama-2-7b-hf --micro-batch 4 --seq-len 4096   # import in memory, then estimate
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --deepspeed tests/fixtures/launch/scripts/zero3.json
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --offload-optimizer cpu --offload-param cpu   # ZeRO-3 offload
  memspec estimate specs/experiments/llava-1.5-7b-pretrain.yaml --offload-optimizer cpu   # ZeRO-2, optimizer in host memory
  memspec estimate specs/qwen2/qwen2.5-0.5b.yaml --micro-batch 4 --seq-len 1024 --fsdp --dp 8   # PyTorch FSDP2
  memspec estimate specs/qwen2/qwen2.5-0.5b.yaml --micro-batch 4 --seq-len 1024 --accelerate-config tests/fixtures/accelerate/fsdp2.yaml
  memspec estimate --from-command tests/fixtures/launch/scripts/v1_5/finetune.sh --dp 8 --gpu a100-80gb   # the model: its --model_name_or_path
  memspec estimate --from-command tests/fixtures/launch/scripts/v1_5/finetune.sh specs/llava/llava-1.5-7b.yaml --dp 8 --gpu a100-80gb
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --gpu 24GiB --margin 5%   # a GPU by its memory
  memspec estimate specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb --fail-if-oom   # exit 4 if it does not fit

With --gpu, "fits" means the allocator's replay never runs out of the GPU's memory and the
device figure (nvidia-smi) is within the memory less the margin (--margin, default
specs/gpus.yaml device.margin_pct). Exit codes: 0 ok, 1 the input is wrong, 2 the command
line is wrong, 3 a bug in memspec, 4 with --fail-if-oom: it does not fit.

--from-command reads the deepspeed / torchrun / accelerate launch / python line of a shell
script: HF TrainingArguments and LLaVA flags, the launcher's GPU count, and the DeepSpeed
config its --deepspeed names; unused flags and config keys are listed on stderr. memspec's
own flags win over the script's. Without a file, the model is the one its
--model_name_or_path names (a LLaVA script's with --vision_tower and --mm_projector_type): a
model folder, a bundled spec (memspec list) or a cached hub id; a file given wins.
"""
TABLE_EXAMPLES = """examples:
  memspec table specs/experiments/llava-1.5-7b-pretrain.yaml --format tsv
  memspec table specs/llava/llava-1.5-13b.yaml --micro-batch 1 --seq-len 1024
  memspec table --from-command tests/fixtures/launch/scripts/v1_5/pretrain.sh specs/llava/llava-1.5-7b.yaml --format tsv
"""
REPORT_EXAMPLES = """examples:
  memspec report specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb -o report.html
  memspec report specs/llava/llava-1.5-13b.yaml --micro-batch 4 --seq-len 2048 --zero 2 --dp 8 -o 13b.html
  memspec report Qwen/Qwen2.5-7B --micro-batch 4 --seq-len 4096 --gpu a100-80gb -o qwen.html --format json
  memspec report --from-command tests/fixtures/launch/scripts/v1_5/finetune.sh --dp 8 -o finetune.html

The page holds the peak per GPU (allocated, reserved, device; first step and steady state;
the phase and layer of the peak; with --gpu the capacity, fits or not, headroom), a stacked
bar chart of module x factor, the step's memory timeline with the peak and the capacity
marked, the layer table, and the assumptions (not modelled, notes, named constants, the seed
paper's sum). One file: inline CSS and SVG, no script, nothing fetched. Its numbers are those
of memspec estimate --format json.
"""
IMPORT_EXAMPLES = """examples:
  memspec import llava-hf/llava-1.5-7b-hf -o specs/llava/llava-1.5-7b-hf.yaml
  memspec import ./checkpoints/my-finetune/            # a local folder; prints the spec
  memspec import meta-llama/Llama-2-7b-hf --revision main --format json

A hub id reads config.json, preprocessor_config.json and the safetensors headers only (never
the weights), cached by huggingface_hub; set HF_TOKEN for gated or private repos and
HF_HUB_OFFLINE=1 to use the cache only.
"""
FIT_EXAMPLES = """examples:
  memspec fit specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb --dp 8 --zero 3
  memspec fit specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb --dp 8 --zero 2 --margin 5%
  memspec fit specs/llava/llava-1.5-13b.yaml --micro-batch 1 --seq-len 2048 --gpu a100-80gb --format json
  memspec fit specs/experiments/llava-1.5-7b-finetune.yaml --deepspeed ds_config.json --gpu h100-80gb
  memspec fit specs/experiments/llava-1.5-7b-finetune.yaml --gpu a100-40gb --offload-optimizer cpu --offload-param cpu
  memspec fit --from-command tests/fixtures/launch/scripts/v1_5/pretrain.sh --dp 8 --gpu h100-80gb   # the model: its --model_name_or_path
  memspec fit specs/experiments/llava-1.5-7b-finetune.yaml --gpu 24GiB --dp 1 --zero 0   # nothing fits: the levers

A setup fits when the allocator's replay never runs out of the GPU's memory and the device
figure (nvidia-smi) is within that memory less the margin (--margin; default specs/gpus.yaml
device.margin_pct, the estimate's worst under-estimate measured on a GPU). With torch's
allocator defaults and that margin, fit also gives the largest micro-batch under
--alloc-conf expandable_segments:True, with the margin measured for it. When the setup as
given does not fit, fit tries each lever alone, cheapest first, at micro-batch 1 when not even
that fits: expandable segments (--alloc-conf expandable_segments:True, with its own margin),
gradient checkpointing on every module, a higher ZeRO stage (dp > 1), LoRA r16,
QLoRA (4-bit nf4), ZeRO-3 with optimizer and parameters offloaded to CPU, more GPUs (dp
doubled up to 64), each with the device figure it reaches and the flags that make it.
"""
SWEEP_EXAMPLES = """examples:
  memspec sweep specs/experiments/llava-1.5-7b-finetune.yaml --micro-batch 1,2,4,8 --seq-len 1024:4096:x2 --gpu h100-80gb
  memspec sweep specs/experiments/llava-1.5-7b-finetune.yaml --micro-batch 1:16:x2 --zero 2,3 --dp 8 \\
      --gradient-checkpointing on,off --format csv -o sweep.csv --svg sweep.svg
  memspec sweep specs/experiments/llava-1.5-7b-lora.yaml --lora-rank off,8,16,64 --format json
  memspec sweep Qwen/Qwen2.5-7B --micro-batch 1,2,4 --seq-len 2048,4096 --gpu a100-80gb   # a hub id

Value lists: 1,2,4 (values), 1024:8192:x2 (doubling, stop included), 1:16:+4 (steps of 4),
on,off or language+vision (checkpointed modules; 'on' is the experiment's, else the language
model), off,8,64 (LoRA ranks; off is no LoRA). Every point is what `memspec estimate` gives
with the same flags. The chart plots the device figure (nvidia-smi) against the first knob
with two or more values (--x to choose), one line per combination of the others, and the
GPU's memory (--gpu, else the default GPU) as a dashed line. A progress bar goes to stderr
when it is a terminal (--quiet turns it off).
"""
LIST_EXAMPLES = """examples:
  memspec list                                   # every bundled model spec and experiment
  memspec list llava --format json

Every command that takes a file takes these short names too, from any directory:
'memspec estimate llava-1.5-7b --micro-batch 16 --seq-len 2048',
'memspec fit llava-1.5-7b-finetune --gpu h100-80gb'. A path that exists always wins.
"""
DIFF_EXAMPLES = """examples:
  memspec diff                                   # against the merge-base with main
  memspec diff --base HEAD                       # only the uncommitted edits
  memspec diff --base origin/main --format markdown > memspec-diff.md   # for a pull request
  memspec diff --base v0.3.0 --format json

Cases: every experiment under specs/, every model spec under specs/ at micro-batch 1 and
seq-len 2048 (everything trainable, bf16-mixed AdamW), and every golden case in tests/cases/.
Each side is estimated by its own compiler, formulas and specs (the base unpacked with git
archive into a temporary folder), so the diff is the whole effect of the change. Only the
cases that moved are listed, largest change first; --format json lists every case.
"""
VALIDATE_EXAMPLES = """examples:
  memspec validate tests/measured/                          # every record; the gate in tests/measured/thresholds.yaml
  memspec validate tests/measured/cpu-trace/mistral_7b_b1_s1024_sdpa_gc-off.json --format json
  memspec validate my-records/ --max-mape 0.5 --max-worst 2 --max-under 0   # exit 1 past a threshold
  memspec validate tests/measured/gpu/t5_base_b8_s1024_t128_gc-on.json --history tests/fixtures/gpu-history/t5_base_b8_s1024_t128_gc-on.history.jsonl.gz

A record is a memspec/measured/v1 JSON file (memspec measure writes them, docs/measuring.md
describes the fields): its experiment is estimated and compared measure by measure.
"""
CHECK_EXAMPLES = """examples:
  memspec check specs/            # every spec and experiment below, and every formula
  memspec check formulas/linear.yaml specs/llava/llava-1.5-7b.yaml
  memspec check specs/ formulas/ --format json    # {"checked": [...], "errors": [...]}

Exit 1 with every problem listed (file:line:col, code, what would be right); the formula
library and its worked examples are checked every time, since every spec depends on them.
"""


FILE_FROM_SCRIPT = "with --from-command it may be left out: the script's --model_name_or_path names the model"
