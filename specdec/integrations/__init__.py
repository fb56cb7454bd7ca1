"""specdec's drafters and policy inside other serving engines (vllm.py: vLLM's `custom_class` proposer)."""
