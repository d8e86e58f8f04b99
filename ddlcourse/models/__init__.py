"""Models the learner can read: small at smoke/laptop scale, larger at cluster scale.

small     MLP and SmallCNN for the concept notebooks
<case>    one module per case study
"""
