"""apps.pipeline.timeline: the validator catches broken schedules; planned bubbles meet the formulas."""

from __future__ import annotations

import pytest

from apps.pipeline.schedules import SCHEDULES, Action, ScheduleError, actions, splits_backward
from apps.pipeline.timeline import formula, plan, simulate, validate

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def _rows(name, p, m, v=1):
    return [list(actions(name, p, m, v, r)) for r in range(p)]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 3), (3, 2), (3, 6), (4, 4), (4, 8), (4, 16), (5, 10)])
def test_every_schedule_validates_without_deadlock(name, p, m):
    for v in ((1, 2, 3) if name == "interleaved" else (1,)):
        if name == "interleaved" and m % p:
            continue
        validate(_rows(name, p, m, v), p, m, v, splits_backward(name))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1", "naive"])
@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16), (3, 9)])
def test_planned_bubble_equals_the_formula(name, p, m):
    v = 2 if name == "interleaved" else 1
    if name == "interleaved" and m % p:
        pytest.skip("interleaved needs m a multiple of p")
    assert plan(name, p, m, v).bubble() == pytest.approx(formula(name, p, m, v), abs=1e-12)


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
        validate(rows, 2, 2, 1, False)


def test_weight_gradient_before_input_gradient_is_refused():
    rows = _rows("zb-h1", 2, 2)
    i = rows[0].index(Action("I", 0, 0))
    w = rows[0].index(Action("W", 0, 0))
    rows[0][i], rows[0][w] = rows[0][w], rows[0][i]
    with pytest.raises(ScheduleError, match="0W0 before 0I0"):
        validate(rows, 2, 2, 1, True)
