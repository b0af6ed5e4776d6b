"""The VoxCPM2 networks: configuration, MiniCPM backbone, LocEnc/LocDiT/CFM, the full network,
AudioVAE, the seeded noise and prompt construction."""
