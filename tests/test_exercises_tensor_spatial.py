"""Notebook 18's coding exercise beyond what tests/test_build_it.py runs (the registered solution and
mistakes): the halo exchange plugged into the spatial layers (lab 2 trains with it)."""
from helpers import check_on_ranks


def test_a_learners_halo_exchange_plugs_into_the_spatial_layers():
    check_on_ranks(3, "exercises_tensor_spatial_halo_plugged")
