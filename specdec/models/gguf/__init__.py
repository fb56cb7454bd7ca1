"""GGUF files: reading them (reader, file, metadata per architecture: arch, llama, gemma3), their blocks (blocks: every
type's decoding; weights: the kernels' planes), their tokenizers (tokenizer, spm), converting them (convert), and
writing random-weight ones of real shapes (synth, synth_blocks)."""
