"""Hopfield layers as ``torch.nn`` modules."""

from hopfield.nn.gates import GatedAttention
from hopfield.nn.hopfield import (
    Hopfield,
    HopfieldLayer,
    HopfieldOutput,
    HopfieldPooling,
    OutEffHop,
    OutEffHopLayer,
    OutEffHopPooling,
)

__all__ = [
    "GatedAttention",
    "Hopfield",
    "HopfieldLayer",
    "HopfieldOutput",
    "HopfieldPooling",
    "OutEffHop",
    "OutEffHopLayer",
    "OutEffHopPooling",
]
