"""The JSON aliases' one helper: a field that should list objects, read so that nothing crashes."""

from __future__ import annotations

from gpuslice.jsontypes import objects_in


def test_the_objects_of_a_list_in_order() -> None:
    first, second = {"name": "a"}, {"name": "b"}
    assert objects_in([first, second]) == [first, second]
    assert objects_in((first,))[0] is first


def test_anything_but_a_list_of_objects_reads_as_nothing() -> None:
    for value in (None, "ab", {"name": "a"}, 3, [None, "a", 3, []]):
        assert objects_in(value) == []
