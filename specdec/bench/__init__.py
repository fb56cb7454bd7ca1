"""Measure the hardware (`specdec profile`) and the engine on Spec-Bench prompts (`specdec bench`)."""
