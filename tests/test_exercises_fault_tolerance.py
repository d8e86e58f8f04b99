"""The fault-tolerance build-it: where its checker kills the learner's job. tests/test_build_it.py runs the
checker itself (the reference passes, each mistake is named)."""
import random

from ddlcourse.exercises.checkers import fault_tolerance as ft


def _resume_points(attempts):
    """The checkpoint each attempt starts from, simulated as the reference job would save them."""
    done, starts = 0, []
    for k in attempts:
        starts.append(done)
        if "kill_step" in k:
            done = k["kill_step"] // ft._FT_EVERY * ft._FT_EVERY
        elif "kill_save" in k:
            done += (k["kill_save"] - 1) * ft._FT_EVERY
    return starts


def test_the_kill_points_are_random_and_every_restart_can_show_a_mistake():
    schedules = [ft.ft_schedule(random.Random(seed)) for seed in range(200)]
    for s in schedules:
        assert s[-1] == {} and len(s) == 4                             # three deaths, then a run to the end
        assert sorted(next(iter(k)) for k in s[:-1]) == ["kill_save", "kill_step", "kill_step"]
        starts = _resume_points(s)
        assert all(0 < a <= ft._FT_STEPS - 2 for a in starts[1:]), s   # every restart resumes from a checkpoint
        for k, start in zip(s, starts):
            if "kill_step" in k:
                assert k["kill_step"] >= start + 2, s                  # two steps after the restart: momentum shows
    assert len({str(s) for s in schedules}) > 50                       # drawn, not fixed
    assert len({str(s[0]) for s in schedules}) > 3


def test_a_failing_verdict_names_its_kill_points():
    from ddlcourse import selfcheck as sc
    ex = sc.CODE_EXERCISES["train_with_checkpoints"]
    wrong = dict((h, w) for w, h in ex.mistakes)["RNG state"]
    v = ex.checker(wrong)
    assert not v.ok and "this check killed the job" in v.message and "before step" in v.message
    assert "in the middle of save" in v.message and "drawn anew" in v.message
