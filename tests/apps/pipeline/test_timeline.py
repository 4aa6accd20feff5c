"""apps.pipeline.timeline: the validator catches broken schedules; planned bubbles meet the formulas."""

from __future__ import annotations

import pytest

from apps.pipeline.schedules import CHUNKED, SCHEDULES, Action, ScheduleError, actions, backward_ops, default_chunks
from apps.pipeline.timeline import formula, memory, plan, simulate, validate

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _rows(name, p, m, v=1):
    return [list(actions(name, p, m, v, r)) for r in range(p)]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 3), (3, 2), (3, 6), (4, 4), (4, 8), (4, 16), (5, 10)])
def test_every_schedule_validates_without_deadlock(name, p, m):
    for v in ((1, 2, 3) if name in CHUNKED else (default_chunks(name),)):
        if (name == "interleaved" and m % p) or (name == "dualpipev" and m < 2 * p):
            continue
        validate(_rows(name, p, m, v), p, m, v, backward_ops(name), name=name)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16), (3, 9)])
def test_planned_bubble_and_peak_equal_the_formulas(name, p, m):
    v = 2 if name in CHUNKED else default_chunks(name)
    if name == "interleaved" and m % p:
        pytest.skip("interleaved needs m a multiple of p")
    tt = plan(name, p, m, v)
    assert tt.bubble() == pytest.approx(formula(name, p, m, v), abs=1e-12)
    assert tt.peak_in_flight(0) == memory(name, p, m, v)


def test_zb_v_halves_zb_h1s_bubble_at_its_memory():
    # chunk forwards are half a stage: the last rank's fill halves; rank 0 holds 2p half-stage micro-batches
    for p, m in [(2, 8), (4, 16)]:
        zbv, zb1, ofob = plan("zb-v", p, m, 2), plan("zb-h1", p, m), plan("1f1b", p, m)
        assert zbv.bubble() * zbv.makespan == pytest.approx(zb1.bubble() * zb1.makespan / 2)
        assert zbv.peak_in_flight(0) == 2 * ofob.peak_in_flight(0)


def test_zb_h2_keeps_the_tail_filled_when_the_input_gradient_costs_more():
    # at F = I = W ZB-H1 already meets the fill bound; with I > W its W's no longer cover the tail, ZB-H2's do
    costs = {"F": 1.0, "I": 1.5, "W": 0.5}
    h1 = simulate(_rows("zb-h1", 4, 16), costs).bubble()
    h2 = simulate(_rows("zb-h2", 4, 16), costs).bubble()
    assert h2 < h1
    assert plan("zb-h2", 4, 16).peak_in_flight(0) == 7  # 2p - 1


def test_dualpipev_matches_deepseeks_bubble_with_pairs_back_to_back():
    # DeepSeek: (PP/2 - 1)(F&B + B - 3W) per rank on PP/2 = p ranks; chunk costs F = W = 1/2, B = 1, F&B = F + B
    for p, m in [(2, 8), (3, 6), (4, 16)]:
        tt = plan("dualpipev", p, m, 2)
        f, b, w = 0.5, 1.0, 0.5
        assert tt.makespan - tt.busy(0) == pytest.approx((p - 1) * ((f + b) + b - 3 * w))
        assert tt.peak_in_flight(0) == 2 * p + 1  # PP + 1 chunk activations


def test_zero_bubble_idles_a_third_of_1f1b():
    # idle time (units, F = I = W = 1): ZB-H1 (p-1)(F+I-W) = p-1 per rank against 1F1B's (p-1)(F+B) = 3(p-1)
    for p, m in [(2, 8), (4, 16), (4, 8), (3, 6)]:
        zb, ofob = plan("zb-h1", p, m), plan("1f1b", p, m)
        idle = [t.bubble() * t.makespan for t in (zb, ofob)]
        assert idle[0] == pytest.approx(idle[1] / 3)


def test_1f1b_holds_at_most_p_micro_batches_gpipe_holds_m():
    for p, m in [(2, 8), (4, 16)]:
        assert plan("1f1b", p, m).peak_in_flight(0) == p
        assert plan("gpipe", p, m).peak_in_flight(0) == m
        assert plan("zb-h1", p, m).peak_in_flight(0) <= p


def test_crossed_receives_deadlock_and_say_where():
    rows = _rows("1f1b", 2, 2)
    # rank 0 waits for a gradient before sending the forward rank 1 needs to produce it
    r0 = [a for a in rows[0] if a.op != "SEND_F"]
    r0.insert(r0.index(Action("B", 1, 0)) + 1, Action("SEND_F", 1, 0, 1))
    r0.insert(r0.index(Action("F", 0, 0)) + 1, Action("SEND_F", 0, 0, 1))
    with pytest.raises(ScheduleError, match=r"deadlocks: rank 0 waits at RECV_B 0B1 ←1; rank 1 waits at RECV_F 1F1 ←0"):
        simulate([r0, rows[1]])


@pytest.mark.parametrize("change,match", [
    (lambda rows: rows[0].remove(Action("B", 1, 0)), "rank 0 never runs 0B1"),
    (lambda rows: rows[0].append(Action("B", 1, 0)), r"rank 0 runs 0B1 twice"),
    (lambda rows: rows[1].remove(Action("SEND_B", 0, 1, 0)), "do not pair up"),
    (lambda rows: rows[0].insert(0, rows[0].pop(rows[0].index(Action("B", 0, 0)))), "backward of 0F0 before its forward"),
    (lambda rows: rows[1].append(Action("F", 0, 0)), "stage 0 lives on rank 0"),
])
def test_the_validator_refuses_broken_schedules(change, match):
    rows = _rows("1f1b", 2, 2)
    change(rows)
    with pytest.raises(ScheduleError, match=match):
        validate(rows, 2, 2, 1, "B")


def test_a_local_hand_off_in_the_wrong_order_is_refused():
    rows = _rows("zb-v", 2, 2, 2)  # rank 1 holds stages 1 and 2: 2F0 takes 1F0's output in memory
    row = rows[1]
    i, j = row.index(Action("F", 0, 1)), row.index(Action("F", 0, 2))
    row[i], row[j] = row[j], row[i]
    with pytest.raises(ScheduleError, match="rank 1 runs 2F0 before 1F0, whose output it needs"):
        validate(rows, 2, 2, 2, "IW", name="zb-v")


def test_a_backward_both_whole_and_split_is_refused():
    rows = _rows("dualpipev", 2, 4, 2)
    rows[0].append(Action("I", 0, 0))
    with pytest.raises(ScheduleError, match=r"both 0B0 and the split 0I0/0W0"):
        validate(rows, 2, 4, 2, "BIW", name="dualpipev")


def test_weight_gradient_before_input_gradient_is_refused():
    rows = _rows("zb-h1", 2, 2)
    i = rows[0].index(Action("I", 0, 0))
    w = rows[0].index(Action("W", 0, 0))
    rows[0][i], rows[0][w] = rows[0][w], rows[0][i]
    with pytest.raises(ScheduleError, match="0W0 before 0I0"):
        validate(rows, 2, 2, 1, "IW")
