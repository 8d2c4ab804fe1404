"""Data for nanoFFN: tokenizers, token shards, the training loader and one prepare.py per dataset (see README.md)."""
