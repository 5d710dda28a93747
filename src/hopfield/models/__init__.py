"""The papers' whole architectures, built from the layers of :mod:`hopfield.nn`.

No training loop lives here: every model trains through :class:`hopfield.training.Trainer`.

* :mod:`hopfield.models.hyperset`: Hyper-SET task models (Sudoku, image classification, masked
  token modelling) and their Transformer baselines;
* :mod:`hopfield.models.energy_transformer`: the Energy Transformer (Hoover et al. 2023), the
  Hyper-SET paper's energy-based baseline;
* :mod:`hopfield.models.shared_qkv`: the shared-QKV Transformer (and its sign-reversed variant)
  of the Hyper-SET paper's App. F.3;
* :mod:`hopfield.models.stanhop`: STanHop-Net (Hu et al. 2024) for multivariate forecasting;
* :mod:`hopfield.models.forecasting`: the nonparametric paper's Hopfield forecaster;
* :mod:`hopfield.models.mil`: the multiple-instance-learning network (Hopfield pooling of bags);
* :mod:`hopfield.models.vision`: the small ViT-style Hopfield classifier of the convergence study.
"""

from hopfield.models.energy_transformer import EnergyTransformerEncoder
from hopfield.models.forecasting import HopfieldForecaster
from hopfield.models.hyperset import ImageClassifier, MaskedTokenModel, SudokuModel
from hopfield.models.mil import MILNet
from hopfield.models.shared_qkv import SharedQKVTransformerEncoder
from hopfield.models.stanhop import STanHopNet
from hopfield.models.vision import VisionHopfield

__all__ = [
    "EnergyTransformerEncoder",
    "HopfieldForecaster",
    "ImageClassifier",
    "MILNet",
    "MaskedTokenModel",
    "STanHopNet",
    "SharedQKVTransformerEncoder",
    "SudokuModel",
    "VisionHopfield",
]
