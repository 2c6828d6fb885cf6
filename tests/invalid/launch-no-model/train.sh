#!/bin/bash
accelerate launch --num_processes 8 sft.py \
    --per_device_train_batch_size 4 \
    --max_seq_length 1024 \
    --bf16
