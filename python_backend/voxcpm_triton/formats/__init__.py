"""On-disk and text formats: checkpoint files, LoRA adapters, the tokenizer and the text normaliser."""
