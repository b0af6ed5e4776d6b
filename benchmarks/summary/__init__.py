"""benchmarks/summarize.py's pieces: the raw files' readers (raw.py), shared plot helpers (plots.py), and each
session's section of results.md with its plot (sessionNN.py, the NNth session's), run in order by SECTIONS."""
