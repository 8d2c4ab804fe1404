"""Data for nanoFFN: tokenizers (tokenizer.py), the token shard format (shards.py), the training/validation
loader (loader.py) and one prepare.py per dataset (shakespeare_char, shakespeare, openwebtext, fineweb10B, text)."""
