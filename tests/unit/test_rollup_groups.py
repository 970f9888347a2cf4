"""Which groups of one level are due for a roll-up: the bisection against the rule spelled out
group by group (complete, not rolled up yet, at least `keep` newer items)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chatmem.memory.summaries import due_groups


def spelled_out(indexes: set[int], rolled: set[int], fanin: int, keep: int) -> list[int]:
    due = []
    for group in range(0, max(indexes, default=-1) // fanin + 1):
        members = [i for i in indexes if group * fanin <= i < (group + 1) * fanin]
        newer = sum(1 for i in indexes if i >= (group + 1) * fanin)
        if len(members) == fanin and newer >= keep and group not in rolled:
            due.append(group)
    return due


@given(
    st.sets(st.integers(0, 60), max_size=50),
    st.sets(st.integers(0, 20), max_size=8),
    st.integers(1, 6),
    st.integers(0, 5),
)
def test_due_groups_follow_the_rule(indexes, rolled, fanin, keep):
    assert due_groups(indexes, rolled, fanin=fanin, keep=keep) == spelled_out(indexes, rolled, fanin, keep)


def test_a_gap_holds_its_group_back_and_the_newest_stay():
    # fanin 3, keep 2: group 0 lacks index 1; group 1 is complete with 2 newer; group 2 has 1 newer.
    assert due_groups({0, 2, 3, 4, 5, 6, 7, 8, 9}, set(), fanin=3, keep=2) == [1]
    assert due_groups({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0}, fanin=3, keep=2) == [1]
