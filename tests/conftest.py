import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root


@pytest.fixture(scope="session")
def shakespeare_char_dir(tmp_path_factory):
    """A data_dir holding a freshly prepared shakespeare_char (about a second): DataLoader('shakespeare_char', ...,
    data_dir=shakespeare_char_dir) works without touching the repo's data/."""
    import importlib.util
    root = tmp_path_factory.mktemp("data")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "shakespeare_char", "prepare.py")
    spec = importlib.util.spec_from_file_location("shakespeare_char_prepare", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.prepare(out_dir=str(root / "shakespeare_char"))
    return str(root)
