"""hopfield: modern Hopfield networks (dense associative memories) as PyTorch layers.

``hopfield.functional`` holds the separation maps and :func:`~hopfield.functional.associate`;
``hopfield.nn`` the layers; ``hopfield.experiments`` the reproductions of the papers.
"""

__version__ = "0.1.0"
