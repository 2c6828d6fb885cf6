"""Models of what holds device memory beside the step's tensors: the CUDA caching allocator."""
