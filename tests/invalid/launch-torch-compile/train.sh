#!/bin/bash
torchrun --nproc_per_node 8 train.py \
    --per_device_train_batch_size 4 \
    --torch_compile True \
    --bf16 True
