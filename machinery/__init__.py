"""The machinery around nanoFFN's ideas (activations.py, model.py) and its commands (train, sample, compare, bench,
inspect_run): one module for each thing it does. README.md's tree says which."""
