"""Data generators. Nothing is downloaded: every data set is made by code in this package.

Modules
-------
toy       small synthetic tasks for the concept notebooks (blobs, teacher classification, shapes images)
tokens    token sequences with something to learn, for the small transformer (the sort task)
cache     seeded, rank-sharded, cached generation shared by the case studies' generators
maize     lab 1: in-field maize images made procedurally, with instance masks and anomalies
seismic   lab 2: 3-D seismic volumes with an exact facies label at every voxel
topology  lab 3: random loads and supports, solved by SIMP
driving   lab 4: multi-camera driving clips whose conflict labels come from the physics
"""
