"""The coding exercise of notebook 09 (memory): bytes of fp32 training state per model and optimizer."""
from ddlcourse.exercises import nb09_memory as ex
from ddlcourse.selfcheck import run_checker


def test_training_state_bytes_accepts_a_correct_solution():
    per_param = {"sgd": 8, "momentum": 12, "adam": 16}          # weights + gradients + optimizer state, fp32
    assert run_checker("training_state_bytes", lambda P, opt: per_param[opt] * P).ok


def test_training_state_bytes_names_mistakes():
    for kind, hint in [("no_grads", "left out the gradients"), ("elements", "not bytes"), ("adam_one", "two moments")]:
        v = run_checker("training_state_bytes", ex._state_variant(kind))
        assert not v.ok and hint in v.message, (kind, v.message)
