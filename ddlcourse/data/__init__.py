"""Data generators. Nothing is downloaded: every data set is made by code in this package.

toy       small synthetic tasks for the concept notebooks (blobs/teacher classification, shapes images)
cache     sharded, seeded, cached generation shared by the case-study generators
<case>    one generator per case study (maize, seismic, topology, driving)
"""
