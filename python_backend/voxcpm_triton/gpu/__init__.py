"""What the engine (`engine/`) and the streaming VAE (`audio/`) share to run on a GPU: bucket tables
(`buckets`), CUDA graph capture (`cuda_graph`), and host-GPU copies that do not wait for the GPU
(`host_copies`)."""
