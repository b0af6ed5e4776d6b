"""Kernel name fragments -> the kinds a profile is summarized by (bench.py measures, summarize.py
reads the raw profiles); first match wins, the rest is "other"."""

KERNEL_KINDS = (  # (kind, name fragments) for the step profile's summary; first match wins
    ("GEMM (cuBLAS)", ("nvjet", "gemm", "cublas", "splitKreduce", "cutlass")),
    ("LocDiT/LocEnc attention (Triton)", ("_local_attention_kernel",)),
    ("paged decode attention (Triton)", ("_paged_decode_kernel", "_merge_splits_kernel")),
    ("fused pointwise/norm (inductor)", ("triton_",)),
    ("flash attention (prefill)", ("flash",)),
)


VAE_KERNEL_KINDS = (
    ("Triton kernels (vae_kernels)",  # before "conv"
     ("_dwconv_snake_kernel", "_snake_extend_kernel", "_skip_add_kernel", "_phase_interleave_kernel",
      "_unit_tail_kernel", "_unit_cl_kernel", "_conv_tanh_kernel")),
    ("convolution (cuDNN)", ("conv", "xmma", "cudnn", "implicit", "fprop", "dgrad", "nvjet", "gemm", "cutlass")),
    ("snake (compiled)", ("triton_",)),
)
