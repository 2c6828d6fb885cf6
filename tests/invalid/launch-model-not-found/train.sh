#!/bin/bash
# the model is a folder a previous run would have written; it is not there
torchrun --nproc_per_node 8 train.py \
    --model_name_or_path ./checkpoints/my-finetune \
    --per_device_train_batch_size 4 \
    --max_seq_length 2048 \
    --bf16 True
