"""Every case in $NEWSSTUDIO_GOLDEN_DIR/musetalk/ against our implementation, one test per case."""
from __future__ import annotations

import pytest

from golden.dispatch import run_case
from golden.golden_io import case_files

CASES = case_files("musetalk")


@pytest.mark.golden
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path):
    run_case("musetalk", path)


def test_cases_present():
    assert CASES, "no golden cases found for musetalk: set NEWSSTUDIO_GOLDEN_DIR"
