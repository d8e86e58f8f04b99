"""Every checked comparison of training runs holds at the cluster profile's ranks, steps and learning rates (issue 45).

CI runs the notebooks at smoke scale only: a claim that holds after 6 steps on 2 ranks can fail after 200 steps on 8,
in front of a class. Notebooks 05 and 06 did: they required the final parameters within 1e-5 of the serial ones,
and at the cluster profile's 200 steps at lr 0.2 two correct float32 runs end 1e-3 apart. Here such claims run on
CPU ranks at the cluster profile's rank count, step count and learning rate, with the widths reduced where only
wall time depends on them, and are checked with the predicate their notebook prints.

Covered: notebook 05 cell 12 and notebook 06 cells 8 and 12 (tests/ranks/cluster_scale_data_parallel.py), and
notebook 09 cell 16, whose float64 runs end within 1e-12 of each other (tests/ranks/cluster_scale_param_server.py).
The other checked comparisons of training runs need no run here: notebook 03's float64 runs on 1, 2 and 4 ranks stay
within 5e-16 of each other over the cluster profile's 315 steps (measured), far inside its 1e-9; 11 compares the
first 10 steps only; 19's sharded runs take 3 steps at cluster scale and its hybrid check one step; 20, 26 and labs
1 and 2 compare the first steps tightly and the rest statistically (``integrity.trajectories_agree``); 12 compares
the ranks of one run with each other, bit for bit, whatever its length. Lab 3 compares its 1- and 2-rank loss curves
with ``integrity.trajectories_agree`` too; running it here would need its SIMP data set of 8192 designs.
"""
import ast

import nbformat
import pytest

from helpers import ROOT, run_ranks

pytestmark = pytest.mark.mpi

WIDTH = 64          # notebooks 05 and 06: the MLP's hidden width (the cluster profile's is 256)
PS_WIDTH = 32       # notebook 09: the MLP's hidden width (the cluster profile's is 128)


@pytest.mark.parametrize("name", ["05_data_parallel.ipynb", "06_data_parallel_in_practice.ipynb"])
def test_the_notebooks_check_what_is_run_here(name):
    code = "\n".join(c.source for c in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells
                     if c.cell_type == "code")
    assert "exp.agrees_with_serial(" in code, \
        f"{name} no longer compares its runs with exp.agrees_with_serial, the check this test runs at cluster scale"


def _data_parallel_claims(*args) -> dict:
    return ast.literal_eval(run_ranks(8, "cluster_scale_data_parallel", WIDTH, *args, timeout=600).stdout.strip()
                            .splitlines()[-1])


def test_data_parallel_claims_hold_at_cluster_scale():
    out = _data_parallel_claims()
    failed = [k for k, ok in out["claims"].items() if not ok]
    assert not failed, f"false at the cluster profile's ranks, steps and lr: {failed}; figures: {out['figures']}"


def test_the_claim_notebooks_05_and_06_made_before_is_caught():
    """The planted case: the final parameters within 1e-5 of serial's, after the whole run."""
    out = _data_parallel_claims("final")
    assert not out["claims"]["05 sgd ddp"] and not out["claims"]["06 no_sync"], out


def test_parameter_server_claims_hold_at_cluster_scale():
    out = ast.literal_eval(run_ranks(8, "cluster_scale_param_server", PS_WIDTH, timeout=600).stdout.strip()
                           .splitlines()[-1])
    failed = [k for k, ok in out["claims"].items() if not ok]
    assert not failed, f"false at the cluster profile's ranks, steps and lr: {failed}; figures: {out['figures']}"
