"""Physics solvers that make the ground truth of the case studies.

Modules
-------
simp        SIMP compliance minimisation (topology optimisation) in 2D (Q4) and 3D (H8)
"""
