"""Physics solvers that make the ground truth of the case studies.

simp        SIMP compliance minimisation (topology optimisation) in 2D (Q4) and 3D (H8)
bench_simp  speed of ``simp`` against the reference ``pytopo3d`` on the same 3D problem
"""
