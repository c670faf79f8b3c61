"""Shared fixtures: small data files, and the command line to compare with."""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def blobs(tmp_path):
    """2,000 float32 rows of 16 columns around 5 centres, saved as X.npy,
    and 5 initial centres (rows of the data) as C.npy."""
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=6, size=(5, 16))
    X = (centres[rng.integers(0, 5, 2000)] + rng.normal(size=(2000, 16))).astype(np.float32)
    C = X[rng.choice(2000, 5, replace=False)].copy()
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "C.npy", C)
    return tmp_path / "X.npy", tmp_path / "C.npy"


@pytest.fixture
def cli():
    """The `outcore` command line (OUTCORE_BIN, or target/release/outcore).
    Missing: the test is skipped, unless OUTCORE_REQUIRE_CLI=1 (CI)."""
    exe = os.environ.get("OUTCORE_BIN") or str(ROOT / "target" / "release" / "outcore")
    if not os.access(exe, os.X_OK):
        exe = shutil.which("outcore")
    if exe is None:
        if os.environ.get("OUTCORE_REQUIRE_CLI") == "1":
            pytest.fail("the outcore command line is missing (build it: cargo build --release)")
        pytest.skip("the outcore command line is not built")
    return exe

