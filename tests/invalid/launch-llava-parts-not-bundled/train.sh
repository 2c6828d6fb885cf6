#!/bin/bash
# LLaVA-1.5's recipe with LLaVA-1's linear projector (train.py's default when no
# --mm_projector_type is given): no bundled spec is built from these parts
deepspeed llava/train/train_mem.py \
    --model_name_or_path lmsys/vicuna-7b-v1.5 \
    --vision_tower openai/clip-vit-large-patch14-336 \
    --mm_vision_select_layer -2 \
    --per_device_train_batch_size 16 \
    --model_max_length 2048 \
    --bf16 True
