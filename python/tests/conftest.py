import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


@pytest.fixture
def rng(request):
    """A fresh seed per test, printed so a failure can be rerun with SLIMSERVE_TEST_SEED."""
    seed = int(os.environ.get("SLIMSERVE_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"{request.node.name}: seed {seed}")
    return np.random.default_rng(seed)
