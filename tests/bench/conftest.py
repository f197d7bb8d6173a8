"""Fixtures of the benchmark smoke test: the runner module (bench/run.py) and the build's bin folder."""
import os
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def runner():
    # Loaded by test_bench_smoke.py at import time under this name.
    return sys.modules["mallard_bench_run"]


@pytest.fixture(scope="session")
def bins():
    build = Path(os.environ.get("MALLARD_BUILD_DIR", _REPO / "build"))
    return build / "bin"
