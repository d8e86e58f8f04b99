"""Models the learner can read: small at smoke/laptop scale, larger at cluster scale.

Modules
-------
small        MLP and SmallCNN for the concept notebooks
transformer  a small decoder-only transformer and a mixture of experts (notebooks 20-22, 30)
maize        lab 1: a small U-Net for instance segmentation, an autoencoder for anomalies
seismic      lab 2: a small U-Net in 2-D (sections) or 3-D (cubes)
topology     lab 3: a U-Net surrogate for density prediction, 2-D and 3-D
driving      lab 4: one (2+1)-D encoder per camera view, fused by a small head
"""
