"""The embedded default model: a character tokenizer and a tiny warm-started causal LM."""
