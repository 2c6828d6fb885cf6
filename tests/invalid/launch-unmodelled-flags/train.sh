#!/bin/bash
lm=$1
torchrun --nproc_per_node 8 llava/train/train.py \
    --model_name_or_path $lm \
    --per_device_train_batch_size $2 \
    --optim adamw_anyprecision \
    --image_aspect_ratio anyres \
    --gradient_checkpointing maybe \
    --bf16 True
