"""The VoxCPM2 networks: configuration, MiniCPM backbone, LocEnc/LocDiT/CFM, the full network,
AudioVAE, the seeded noise and prompt construction; LoRA layers (`lora`) and their merge into the
weights (`lora_merge`), fp8 weights (`precision`) and the split-K projections (`split_k`)."""
