"""Exercises of notebooks/15_hyperparameter_search.ipynb."""
from ddlcourse import hpsearch
from ddlcourse.selfcheck import exercise


@exercise("sh_budget", "sum over rungs of (configurations alive) x (budget of the rung); keep n // eta each time")
def sh_budget(n_configs: int, min_budget: int, eta: int) -> int:
    return hpsearch.sh_total_budget(n_configs, min_budget, eta)


@exercise("lr_scaling_exponent", "for each batch size take the lr of the lowest val_loss, then fit a line to "
          "log(lr) against log(batch_size) (np.polyfit(..., 1)[0])")
def lr_scaling_exponent(results: list) -> float:
    return hpsearch.scaling_exponent(results)
