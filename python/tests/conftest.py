"""The suite runs against the *installed* onnx_fuse package (a wheel in a
fresh virtual environment: scripts/test-python.sh) on the checkout's
testdata/."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def testdata():
    return lambda name: ROOT / "testdata" / name


@pytest.fixture
def docs():
    return ROOT / "docs"
