"""On-disk formats: checkpoint files and the tokenizer."""
