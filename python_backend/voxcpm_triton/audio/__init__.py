"""Audio from latents as they stream: each stream's VAE decoder state, decoded in batches by chunk
length with CUDA graphs (`vae_streams`, which `vae_decoder` serves), and the decoder's own audio
thread that decodes its requests' chunks beside the engine (`stream_audio`, decoder parameter
`decode_audio`). And the other way: waveforms to latent patches (`patches`, for `vae_encoder` and the
offline API)."""
