"""Readers of what users already have: DeepSpeed/accelerate configs and launch commands, the hub, the importer and its family mappings."""
