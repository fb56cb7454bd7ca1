"""Training draft heads by self-distillation (`specdec train-draft`, `specdec export-draft`).

It sits above the engine because it drives it: the target writes its own answers (data.py, with the engine), the
head learns the target's choices along them (distill.py), and the CLI ties the two (cli.py). The head model itself
is in specdec.heads, which knows nothing of training.
"""
