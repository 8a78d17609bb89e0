"""Recipes that produce models (an application on top of the library): the demo (:mod:`.demo`: train and
evaluate SEPS on the synthetic scenes) and the contrastive pretraining of the tiny encoders
(:mod:`.pretrain`)."""
