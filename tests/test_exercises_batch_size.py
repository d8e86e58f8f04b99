"""The coding exercise of notebook 02 (linear scaling rule with warmup, as a schedule function)."""
from ddlcourse.exercises.solutions import batch_size as ex
from ddlcourse.optim import scaled_lr, warmup_factor
from ddlcourse.selfcheck import run_checker


def test_accepts_the_reference_and_a_hand_written_solution():
    ref = lambda s, lr, b0, b, w: scaled_lr(lr, b, b0, "linear") * warmup_factor(s, w)  # noqa: E731
    assert run_checker("linear_warmup_schedule", ref).ok

    def mine(step, base_lr, base_batch, global_batch, warmup_steps):
        target = base_lr * global_batch / base_batch
        if warmup_steps > 0 and step < warmup_steps:
            return target * (step + 1) / warmup_steps
        return target
    assert run_checker("linear_warmup_schedule", mine).ok


def test_names_typical_mistakes():
    for wrong, hint in [(ex._from_zero, "(step + 1) / warmup_steps"), (ex._no_warmup, "warmup is missing"),
                        (ex._sqrt_rule, "square-root"), (ex._inverted, "upside down"),
                        (ex._from_base_lr, "Goyal"), (ex._never_ends, "min(1")]:
        v = run_checker("linear_warmup_schedule", wrong)
        assert not v.ok and hint in v.message, (wrong.__name__, v.message)
