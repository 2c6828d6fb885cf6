deepspeed train.py --deepspeed ds_config.json --per_device_train_batch_size 16 --bf16 True
