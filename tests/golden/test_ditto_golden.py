"""Every case in $NEWSSTUDIO_GOLDEN_DIR/ditto/ against our implementation, one test per case."""
from __future__ import annotations

import pytest

from golden.dispatch import checkers
from golden.golden_io import case_files, load_case

CASES = case_files("ditto")


@pytest.mark.golden
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path):
    tensors, meta = load_case(path)
    kind = meta.get("kind")
    check = checkers("ditto").get(kind)
    assert check is not None, f"{path.name}: no checker for kind {kind!r}"
    check(tensors, meta)


def test_cases_present():
    assert CASES, "no golden cases found for ditto: set NEWSSTUDIO_GOLDEN_DIR"
