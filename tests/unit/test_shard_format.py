"""Format 8's drill-down rows as a bucket's directory and shards hold them (`state.shard_format`)."""

from __future__ import annotations

from stream_ndcg.state.shard_format import bucket_rows, encode_row, rows_of, shard_of


def test_a_row_in_pieces_reads_whole_and_pieces_past_its_count_are_left_out() -> None:
    text = encode_row((3.0, 0.1 + 0.2, 1 / 3, 2.0, 0.25, 2 / 7, 3 / 11, 5 / 13, 7 / 17, 0.5, 1e-300, 2.0, 3.0, 4.0,
                       5.0))
    assert len(text) > 64
    first, rest = chr(48 + 2) + text[:63], text[63:]
    assert len(rest) <= 64
    directory = {b"n": b"2", b"c": b"5", b"k": b"2", b'{"variant":"A"}': b"0", b'{"variant":"B"}': b"1"}
    shards = [{b"0|q1": first.encode(), b"0~1|q1": rest.encode(), b"0~2|q1": b"left from a longer row"},
              {b"1|q|2": b"11,,,,,,,,,,,,,,"}]
    assert rows_of(directory, shards) == {('{"variant":"A"}', "q1"): text,
                                          ('{"variant":"B"}', "q|2"): "1,,,,,,,,,,,,,,"}
    # Format 7's row of the same group is older than format 8's; another is read as it is.
    old = {b'{"variant":"A"}\x1fq1': b"9", b'{"variant":"A"}\x1fq7': b"7"}
    rows = {(segment, query): row for _, segment, query, row in bucket_rows(5, old, directory, shards)}
    assert rows[('{"variant":"A"}', "q1")][:2] == (3.0, 0.1 + 0.2)
    assert rows[('{"variant":"A"}', "q7")] == (7.0,)


def test_a_query_has_one_shard_for_a_count_and_the_doubled_count_splits_it_in_two() -> None:
    names = [f"q{n}" for n in range(1000)]
    for name in names:
        assert shard_of(name, 4) in range(4)
        assert shard_of(name, 8) in (shard_of(name, 4), shard_of(name, 4) + 4)
    assert len({shard_of(name, 8) for name in names}) == 8
