"""Text: the tokenizer, chat templates and streaming detokenization."""
