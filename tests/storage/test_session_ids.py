"""New session ids: one at a time and in a batch, the same shape."""

from __future__ import annotations

import re

from storage.session_ids import check_session_id, new_session_id, new_session_ids

_SHAPE = re.compile(r"[0-9a-f]{23}")


def test_a_batch_of_session_ids_is_unique_and_shaped_like_single_ones() -> None:
    ids = new_session_ids(1000, clock=lambda: 0x1234)
    assert len(set(ids)) == 1000
    assert all(_SHAPE.fullmatch(i) and i.startswith("00000001234") for i in ids)
    assert all(check_session_id(i) == i for i in ids)
    assert _SHAPE.fullmatch(new_session_id())
    assert new_session_ids(0) == []
