import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

_DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The public benchmarks (TOOLGRAPH_DATA, else ../shared/datasets); skip if absent, fail in CI."""
    root = Path(os.environ.get("TOOLGRAPH_DATA", _DEFAULT_DATA))
    if not root.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the shared datasets at {root}")
        pytest.skip(f"no shared datasets at {root}")
    return root
