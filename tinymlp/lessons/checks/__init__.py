"""The checks of the course's exercises, one file per lesson (``lesson04_layernorm.py`` holds 04.1
and 04.2); importing this package registers them all in ``tinymlp.lessons.EXERCISES``.
``common.py`` holds what the lessons share: the comparisons, the exactness of a gradient,
gradchecks whose reproduce line runs in the notebook."""

from . import (  # noqa: F401 (each module registers its checks)
    lesson01_backprop_by_hand,
    lesson02_autograd_engine,
    lesson03_writing_an_op,
    lesson04_layernorm,
    lesson05_softmax_attention,
    lesson06_mlp_mixer,
    lesson07_gmlp_sgu,
    lesson08_amlp_tiny_attention,
    lesson10_gradcheck_your_layer,
    lesson12_gmlp_on_text,
)
