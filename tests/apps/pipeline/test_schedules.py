"""apps.pipeline.schedules: literal tables for small (p, m, v), as torchgpipe's clock-cycle test does."""

from __future__ import annotations

import pytest

from apps.pipeline.schedules import (
    CHUNKED,
    SCHEDULES,
    Action,
    ScheduleError,
    actions,
    backward_ops,
    check_shape,
    compute_order,
    default_chunks,
    rank_of,
    stages_of,
    table,
)

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def test_gpipe_3x3_all_forwards_then_all_backwards():
    assert table("gpipe", 3, 3) == [["0F0", "0F1", "0F2", "0B0", "0B1", "0B2"],
                                    ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"],
                                    ["2F0", "2F1", "2F2", "2B0", "2B1", "2B2"]]


def test_1f1b_3x4_warm_up_steady_cool_down():
    # rank r: p - r - 1 warm-up forwards, then one forward and one backward in turn
    assert table("1f1b", 3, 4) == [["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0B2", "0B3"],
                                   ["1F0", "1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1B3"],
                                   ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3"]]


def test_1f1b_fewer_micro_batches_than_stages():
    assert table("1f1b", 4, 2) == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1F1", "1B0", "1B1"],
                                   ["2F0", "2F1", "2B0", "2B1"], ["3F0", "3B0", "3F1", "3B1"]]


def test_interleaved_2x4_two_chunks_megatron_order():
    # rank 0 holds stages 0 and 2; warm-up 2(p - r - 1) + (v - 1)p = 4 forwards, micro-batches in groups of p
    assert table("interleaved", 2, 4, 2) == [
        ["0F0", "0F1", "2F0", "2F1", "0F2", "2B0", "0F3", "2B1", "2F2", "0B0", "2F3", "0B1", "2B2", "2B3", "0B2", "0B3"],
        ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0", "1F3", "1B1", "3F2", "3B2", "3F3", "3B3", "1B2", "1B3"],
    ]


def test_zb_h1_2x4_weight_gradients_fill_the_bubbles():
    assert table("zb-h1", 2, 4) == [
        ["0F0", "0F1", "0I0", "0W0", "0F2", "0I1", "0W1", "0F3", "0I2", "0W2", "0I3", "0W3"],
        ["1F0", "1I0", "1F1", "1I1", "1W0", "1F2", "1I2", "1W1", "1F3", "1I3", "1W2", "1W3"],
    ]


def test_naive_one_micro_batch_at_a_time():
    assert table("naive", 2, 2) == [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_comms_around_the_compute_that_needs_them():
    assert table("1f1b", 2, 2, comms=True) == [
        ["0F0", "SEND_F 0F0 →1", "0F1", "SEND_F 0F1 →1", "RECV_B 0B0 ←1", "0B0", "RECV_B 0B1 ←1", "0B1"],
        ["RECV_F 1F0 ←0", "1F0", "1B0", "SEND_B 1B0 →0", "RECV_F 1F1 ←0", "1F1", "1B1", "SEND_B 1B1 →0"],
    ]


def test_interleaved_sends_wrap_from_the_last_rank_to_the_first():
    row = list(actions("interleaved", 2, 2, 2, rank=1))
    assert Action("SEND_F", 0, 1, 0) in row  # stage 1 (rank 1) feeds stage 2 (rank 0, chunk 1)
    assert Action("RECV_B", 0, 1, 0) in row  # and gets its output's gradient back from there


def test_zb_h2_2x4_warm_up_until_the_first_gradient_then_ws_in_the_tail():
    # rank 0: 2p - 1 = 3 forwards before 0I0 (the first gradient's earliest arrival); at most 2p - 1 in flight
    assert table("zb-h2", 2, 4) == [
        ["0F0", "0F1", "0F2", "0I0", "0W0", "0F3", "0I1", "0I2", "0W1", "0W2", "0I3", "0W3"],
        ["1F0", "1I0", "1F1", "1I1", "1F2", "1I2", "1W0", "1F3", "1I3", "1W1", "1W2", "1W3"],
    ]


def test_zb_v_2x4_chunks_in_a_v():
    # rank 0 holds stages 0 and 3 (the first and the last), rank 1 stages 1 and 2 (the bottom of the V);
    # warm-up 2(p - r) - 1 chunk-0 forwards, r pairs (F chunk 1, F chunk 0), p - r rounds F I W of chunk 1
    assert table("zb-v", 2, 4, 2) == [
        ["0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0F3", "0I0", "0W0",
         "3F2", "3I2", "3W2", "0I1", "0W1", "3F3", "3I3", "3W3", "0I2", "0W2", "0I3", "0W3"],
        ["1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1F2", "1I0", "1W0", "2F2", "2I1", "2W1",
         "1F3", "1I1", "1W1", "2F3", "2I2", "2W2", "1I2", "2I3", "1I3", "1W2", "2W3", "1W3"],
    ]


def test_zb_v_fewer_micro_batches_than_the_v_holds():
    assert table("zb-v", 2, 2, 2) == [
        ["0F0", "0F1", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0I0", "0W0", "0I1", "0W1"],
        ["1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1I0", "1W0", "2I1", "2W1", "1I1", "1W1"],
    ]


def test_dualpipev_2x4_steps_and_overlapped_pairs():
    # rank 0: step 1 2(p-1) = 2 F0; step 2 one (F0, F1); step 3 one (I1, W, F1); step 4 one pair of pairs
    # (F0 & B1, F1 & B0); step 5 one (B1, F1 & B0); step 6 (B1, B0 as I); step 8 the queued W's
    assert table("dualpipev", 2, 4, 2) == [
        ["0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "0F3&", "3B1", "3F2&", "0B0", "3B2", "3F3&", "0B1",
         "3B3", "0I2", "0W2", "0I3", "0W3"],
        ["1F0", "2F0", "1F1", "2F1", "1F2&", "2B0", "2F2&", "1B0", "1F3&", "2B1", "2F3&", "1B1", "2B2", "1B2",
         "2I3", "1I3", "2W3", "1W3"],
    ]


def test_looped_bfs_2x3_every_micro_batch_through_each_chunk():
    assert table("looped-bfs", 2, 3, 2) == [
        ["0F0", "0F1", "0F2", "2F0", "2F1", "2F2", "2B2", "2B1", "2B0", "0B2", "0B1", "0B0"],
        ["1F0", "1F1", "1F2", "3F0", "3F1", "3F2", "3B2", "3B1", "3B0", "1B2", "1B1", "1B0"],
    ]


def test_the_v_layout():
    assert [stages_of("zb-v", 3, 2, r) for r in range(3)] == [[0, 5], [1, 4], [2, 3]]
    assert [rank_of("dualpipev", 3, s) for s in range(6)] == [0, 1, 2, 2, 1, 0]
    assert [stages_of("interleaved", 3, 2, r) for r in range(3)] == [[0, 3], [1, 4], [2, 5]]


def test_the_bottom_of_the_v_hands_over_without_a_message():
    assert table("zb-v", 2, 2, 2, comms=True)[1][:8] == [
        "RECV_F 1F0 ←0", "1F0", "2F0", "SEND_F 2F0 →0", "RECV_F 1F1 ←0", "1F1", "2F1", "SEND_F 2F1 →0"]
    row = [str(a) for a in actions("zb-v", 2, 2, 2, rank=1)]
    assert "SEND_B 2B0 →1" not in row and "1I0" in row  # 2I0's input gradient goes to 1I0 in memory


def test_a_pair_receives_both_before_and_sends_both_after():
    row = table("dualpipev", 2, 4, 2, comms=True)[0]
    i = row.index("3F2&")
    assert row[i - 2:i + 2] == ["RECV_F 3F2 ←1", "RECV_B 0B0 ←1", "3F2&", "0B0"]
    i = row.index("0F3&")
    assert row[i:i + 4] == ["0F3&", "3B1", "SEND_F 0F3 →1", "SEND_B 3B1 →1"]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 1), (2, 2), (2, 4), (3, 5), (3, 6), (4, 4), (4, 8)])
def test_every_micro_batch_once_per_stage(name, p, m):
    v = 2 if name in CHUNKED else default_chunks(name)
    if name == "interleaved" and m % p:
        pytest.skip("interleaved needs m a multiple of p")
    if name == "dualpipev" and m < 2 * p:
        pytest.skip("dualpipev needs m >= 2p")
    ops = backward_ops(name)
    for r in range(p):
        row = list(compute_order(name, p, m, v, r))
        assert len(row) == len(set(row))
        for s in stages_of(name, p, v, r):
            for mb in range(m):
                mine = sorted(a.op for a in row if (a.stage, a.mb) == (s, mb))
                assert mine in ([["B", "F"]] if ops == "B" else [["F", "I", "W"]] if ops == "IW"
                                else [["B", "F"], ["F", "I", "W"]])
        assert len(row) == sum(3 if a.op == "I" else 2 for a in row if a.op in "BI")  # nothing else on the row


@pytest.mark.parametrize("args,match", [
    (("bogus", 2, 2, 1), "unknown schedule 'bogus'"),
    (("1f1b", 0, 2, 1), "stages must be an integer >= 1, got 0"),
    (("1f1b", 2, 0, 1), "micro-batches must be an integer >= 1, got 0"),
    (("interleaved", 2, 3, 2), r"multiple of the stages \(2\); use --micro 2 or 4"),
    (("1f1b", 2, 4, 2), "--chunks 2 applies to the interleaved and looped-bfs schedules only"),
    (("zb-v", 2, 4, 3), "zb-v places exactly two chunks on each rank"),
    (("dualpipev", 3, 5, 2), r"dualpipev needs .* \(m >= 2p = 6\), got 5; use --micro 6"),
])
def test_bad_shapes_say_what_and_how(args, match):
    with pytest.raises(ScheduleError, match=match):
        check_shape(*args)
    with pytest.raises(ScheduleError):
        list(compute_order(*args, rank=0))
