"""specdec beside other engines: llama.cpp (its worker, the logits oracle, `real-models`) and transformers."""
