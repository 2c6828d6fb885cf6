#!/bin/bash
export WANDB_MODE=offline
echo "training"
