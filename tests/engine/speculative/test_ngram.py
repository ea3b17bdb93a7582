"""Prompt lookup (engine/speculative/ngram.py): the longest suffix that occurred before, its latest
occurrence, whole tokens only."""

from engine.speculative.ngram import TokenBuffer, propose


def draft(ids, k=4, min_n=2, max_n=4):
    buffer = TokenBuffer()
    buffer.sync(ids)
    return propose(buffer, k, min_n=min_n, max_n=max_n)


def test_the_tokens_after_the_suffixs_earlier_occurrence_are_proposed():
    assert draft([5, 6, 7, 8, 9, 1, 5, 6, 7]) == [8, 9, 1, 5]
    assert draft([5, 6, 7, 8, 9, 1, 5, 6, 7], k=2) == [8, 9]


def test_the_longest_suffix_wins_over_a_later_shorter_one():
    # [6, 7] occurs last at 3..4 (followed by 0), but [5, 6, 7] at 0..2 (followed by 8)
    assert draft([5, 6, 7, 8, 6, 7, 0, 5, 6, 7], k=1) == [8]


def test_among_occurrences_of_one_suffix_the_latest_wins():
    assert draft([1, 2, 3, 9, 1, 2, 4, 9, 1, 2], k=1) == [4]


def test_a_draft_stops_at_the_end_of_what_is_known():
    assert draft([1, 2, 3, 1, 2], k=8) == [3, 1, 2]


def test_nothing_is_proposed_without_a_match_or_below_min_n():
    assert draft([1, 2, 3, 4]) == []
    assert draft([1, 2, 3, 1]) == []  # only a 1-token suffix repeats
    assert draft([1, 2, 3, 1], min_n=1) == [2, 3, 1]
    assert draft([7]) == [] and draft([]) == []
    assert draft([1, 2, 1, 2], k=0) == []


def test_a_match_across_two_tokens_bytes_is_not_a_match():
    # 0x01000000 then 1 packs (little endian) as 00 00 00 01 01 00 00 00: the bytes of [1] occur
    # at offset 3, inside the two tokens; the only true occurrence of [1] is token 1
    ids = [0x01000000, 1, 7, 1]
    assert draft(ids, k=2, min_n=1, max_n=1) == [7, 1]
    assert draft([0x01000000, 0x00000002, 1], k=1, min_n=1, max_n=1) == []


def test_the_buffer_follows_a_growing_sequence_and_rebuilds_when_it_is_not_a_prefix():
    buffer = TokenBuffer()
    ids = [4, 5, 6]
    buffer.sync(ids)
    ids += [4, 5]
    buffer.sync(ids)
    assert list(buffer.ids) == ids
    assert propose(buffer, 3, min_n=2, max_n=4) == [6, 4, 5]
    buffer.sync([9, 9])
    assert list(buffer.ids) == [9, 9]
