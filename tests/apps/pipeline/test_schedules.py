"""apps.pipeline.schedules: literal tables for small (p, m, v), as torchgpipe's clock-cycle test does."""

from __future__ import annotations

import pytest

from apps.pipeline.schedules import SCHEDULES, Action, ScheduleError, actions, check_shape, compute_order, table

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


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 5), (4, 4), (4, 8)])
def test_every_micro_batch_once_per_stage(name, p, m):
    v = 2 if name == "interleaved" else 1
    if name == "interleaved" and m % p:
        pytest.skip("interleaved needs m a multiple of p")
    for r in range(p):
        row = list(compute_order(name, p, m, v, r))
        assert len(row) == len(set(row))
        ops = ("F", "I", "W") if name == "zb-h1" else ("F", "B")
        assert sorted(row) == sorted(Action(op, mb, c * p + r) for op in ops for mb in range(m) for c in range(v))


@pytest.mark.parametrize("args,match", [
    (("bogus", 2, 2, 1), "unknown schedule 'bogus'"),
    (("1f1b", 0, 2, 1), "stages must be an integer >= 1, got 0"),
    (("1f1b", 2, 0, 1), "micro-batches must be an integer >= 1, got 0"),
    (("interleaved", 2, 3, 2), r"multiple of the stages \(2\); use --micro 2 or 4"),
    (("1f1b", 2, 4, 2), "--chunks 2 applies to the interleaved schedule only"),
])
def test_bad_shapes_say_what_and_how(args, match):
    with pytest.raises(ScheduleError, match=match):
        check_shape(*args)
    with pytest.raises(ScheduleError):
        list(compute_order(*args, rank=0))
