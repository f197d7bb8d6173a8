"""Fixtures of the benchmark smoke test: the build's bin folder and the runner's modules (bench/run.py and friends)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_runner():
    spec = importlib.util.spec_from_file_location("mallard_bench_run", REPO / "bench" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mallard_bench_run"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def runner():
    return _load_runner()


@pytest.fixture(scope="session")
def bins():
    build = Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
    return build / "bin"
