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


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu(n=1, name='NVIDIA H100 80GB HBM3', total_gib=80, free_gib=None, capability=(9, 0)): torch.cuda sees n
    such GPUs for the rest of the test (tests/fake_gpu.py); returns the record of the devices set."""
    import fake_gpu as fake
    return lambda **kw: fake.install(monkeypatch, **kw)
