"""Registry of experiments: a name, presets (configuration data) and a ``run`` function.

Every experiment module in :mod:`hopfield.experiments` registers itself at import time with
:func:`register`; :func:`discover` imports all of them, so the command line never keeps a list.
``hopfield list`` alone reads :data:`LISTINGS`, the names, summaries, presets and papers of the
built-in experiments, so that listing them imports no experiment module (nor torch); a test
keeps the table equal to what the modules register.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hopfield.experiments.results import Results, RunContext

PRESETS = ("tiny", "small", "paper")

RunFunction = Callable[[Any, RunContext], Results]


class ConfigError(ValueError):
    """A configuration an experiment cannot run: an unknown field, or a value of the wrong type
    or out of range. ``apply_overrides`` raises it, and so do experiments that check their
    configuration before they start; the command line prints it as one line (exit status 2)."""


@dataclass(frozen=True)
class Experiment:
    """One registered experiment.

    Attributes:
        name: command-line name, e.g. ``"retrieval-demo"``.
        summary: one line for ``hopfield list``.
        presets: ``{"tiny": config, "small": config, "paper": config}``; configs are dataclass
            instances with at least a ``seed`` field.
        run: ``run(config, context) -> Results``.
        paper: which paper, table or figure the experiment reproduces.
        in_reproduce: whether ``hopfield reproduce`` runs it.
        check: ``check(config)`` raises a :class:`ConfigError` naming the first field the
            experiment cannot run with; the runner calls it before it looks at the output
            folder or creates anything (``None``: the configuration checks itself in
            ``__post_init__``, or anything goes).
        single_process: the experiment trains nothing and uses no collective: under several
            processes only the main process runs it (the others wait for its record) instead
            of every process repeating the same work.
    """

    name: str
    summary: str
    presets: Mapping[str, Any]
    run: RunFunction
    paper: str = ""
    in_reproduce: bool = True
    tags: tuple[str, ...] = field(default_factory=tuple)
    check: Callable[[Any], object] | None = None
    single_process: bool = False

    def __post_init__(self) -> None:
        missing = [p for p in PRESETS if p not in self.presets]
        if missing:
            raise ValueError(f"experiment {self.name!r}: presets {missing} are missing")

    def config(self, preset: str) -> Any:
        """The configuration of ``preset`` (a fresh copy the caller may change); a
        :class:`ConfigError` for an unknown preset."""
        if preset not in self.presets:
            raise ConfigError(f"preset must be one of {sorted(self.presets)}, got {preset!r}")
        return replace(self.presets[preset])


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add ``experiment`` to the registry (names are unique)."""
    if experiment.name in _REGISTRY and _REGISTRY[experiment.name] is not experiment:
        raise ValueError(f"an experiment named {experiment.name!r} is already registered")
    _REGISTRY[experiment.name] = experiment
    return experiment


def unregister(name: str) -> Experiment:
    """Remove the experiment called ``name`` from the registry and return it (for experiments
    registered for a while, as tests and notebooks do)."""
    if name not in _REGISTRY:
        raise ValueError(f"no experiment named {name!r} is registered")
    return _REGISTRY.pop(name)


def discover() -> None:
    """Import every module of :mod:`hopfield.experiments` so that each registers itself."""
    import hopfield.experiments as package

    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_") and module.name not in {"registry", "results", "runner"}:
            importlib.import_module(f"{package.__name__}.{module.name}")


def get(name: str) -> Experiment:
    """The experiment called ``name``; a ``ValueError`` lists the known names otherwise."""
    discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def all_experiments() -> list[Experiment]:
    """All registered experiments, sorted by name."""
    discover()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


@dataclass(frozen=True)
class Listing:
    """What ``hopfield list`` shows of an experiment: its name, summary, preset names and paper."""

    name: str
    summary: str
    presets: tuple[str, ...]
    paper: str = ""

    @classmethod
    def of(cls, experiment: Experiment) -> Listing:
        """The listing of a registered experiment."""
        return cls(experiment.name, experiment.summary, tuple(experiment.presets), experiment.paper)


#: The listings of the experiments of :mod:`hopfield.experiments`, as their modules register them
#: (``tests/test_install.py`` checks that they agree).
LISTINGS: tuple[Listing, ...] = (
    Listing(
        "convergence",
        "Dense vs Sparse vs OutEffHop Hopfield layers in a small ViT: loss/accuracy per epoch",
        ("tiny", "small", "paper"),
        "OutEffHop (Hu et al., 2024) Table 3 / Figure 7 (workshop Figure 6)",
    ),
    Listing(
        "efficiency",
        "forward time, peak memory and FLOPs vs memory size for dense, sparsemax, top-K, random-mask, window, linear and random-feature Hopfield models",
        ("tiny", "small", "paper"),
        "Nonparametric Hopfield (Hu et al., ICML 2025) Figs. 6-7 (App. G.5)",
    ),
    Listing(
        "hyperset-images",
        "Hyper-SET vs weight-shared Transformer on image classification, with the alternative designs, layer-iteration trade-off and depth-wise LoRA",
        ("tiny", "small", "paper"),
        "Hyper-SET §5.2, Table 1, Table 3, Fig. 4, Table 4 (Hu, Zou & Xu)",
    ),
    Listing(
        "hyperset-mim",
        "Toy masked token modelling (k-means patch codes on digits) with Hyper-SET vs Transformer; the paper's ImageNet-100 MIM is not reproducible offline",
        ("tiny", "small", "paper"),
        "Hyper-SET §5.3, Table 2 (toy stand-in only)",
    ),
    Listing(
        "hyperset-sudoku",
        "Hyper-SET vs weight-shared Transformer on Sudoku: accuracy, extrapolation, energy/rank/angle trajectories, step-size ablations",
        ("tiny", "small", "trained", "paper"),
        "Hyper-SET §5.1, Fig. 3, Figs. 5-6, Table 3 (Hu, Zou & Xu)",
    ),
    Listing(
        "memory-capacity",
        "retrieval success vs memory size: OutEffHop family and efficient (Top-K, random, linear, random-feature) Hopfield models on images",
        ("tiny", "small", "paper"),
        "OutEffHop Fig. 5 (App. D.2); nonparametric Fig. 2 (upper)",
    ),
    Listing(
        "mil-benchmark",
        "MIL benchmarks (Elephant, Fox, Tiger, UCSB): cross-validated ROC-AUC",
        ("tiny", "small", "paper"),
        "Nonparametric Hopfield (Hu et al. 2025), Table 5 (search space Table 4)",
    ),
    Listing(
        "mil-bit-pattern",
        "Synthetic bit-pattern MIL: can each pooling method find the signal instance?",
        ("tiny", "small", "paper"),
        "not in the papers' tables (official code bit_pattern.py; hopfield-layers demo)",
    ),
    Listing(
        "mil-mnist-bags",
        "MIL on MNIST bags: test accuracy vs bag size for the Hopfield model family",
        ("tiny", "small", "paper"),
        "Nonparametric Hopfield (Hu et al. 2025), Table 2 settings, Figures 3-4",
    ),
    Listing(
        "noise-robustness",
        "retrieval success vs Gaussian query noise for the OutEffHop family and the efficient Hopfield models",
        ("tiny", "small", "paper"),
        "OutEffHop Fig. 6 (App. D.2); nonparametric Fig. 2 (lower)",
    ),
    Listing(
        "outlier-benchmark",
        "attention sinks and outliers that form on a CPU (Bigram-Backcopy, fixed-BOS LM), "
        "published fixes as positive controls, then Softmax_1 judged",
        ("tiny", "small", "gpu", "paper"),
        "OutEffHop §2.1 and Table 1 against Guo et al. 2024, Gu et al. 2025, Kaul et al. 2025, "
        "Sun et al. 2024",
    ),
    Listing(
        "outlier-cost",
        "training-step time and peak memory of vanilla Softmax vs OutEffHop attention "
        "in BERT, OPT, ViT and STanHop-Net",
        ("tiny", "small", "paper"),
        "OutEffHop (Hu et al., 2024) Table 4 / Fig. 8 (App. D.3)",
    ),
    Listing(
        "outlier-formation",
        "Search for the cheapest recipe under which vanilla attention forms outliers; compare the six attention variants under it",
        ("tiny", "small", "decisive", "paper"),
        "OutEffHop Table 1 / Figure 2 setting (Hu et al. 2024), mechanism of Bondarenko et al. 2023",
    ),
    Listing(
        "outliers",
        "BERT/OPT/ViT with six attention variants: outliers, W8A8, Figures 2-4 (--set model=bert|opt|vit)",
        ("tiny", "small", "paper", "formation"),
        "Table 1 and Figures 2-4 of OutEffHop (Hu et al., 2024)",
    ),
    Listing(
        "outliers-bert",
        "The outlier study for BERT only (= outliers --set model=bert)",
        ("tiny", "small", "paper"),
        "Table 1 and Figures 2-4 of OutEffHop (Hu et al., 2024)",
    ),
    Listing(
        "outliers-opt",
        "The outlier study for OPT only (= outliers --set model=opt)",
        ("tiny", "small", "paper", "formation"),
        "Table 1 and Figures 2-4 of OutEffHop (Hu et al., 2024)",
    ),
    Listing(
        "outliers-vit",
        "The outlier study for ViT only (= outliers --set model=vit)",
        ("tiny", "small", "paper"),
        "Table 1 and Figures 2-4 of OutEffHop (Hu et al., 2024)",
    ),
    Listing(
        "retrieval-demo",
        "store scikit-learn digits in a static Hopfield memory, retrieve from partial/noisy queries across β",
        ("tiny", "small", "paper"),
        "illustration of the retrieval dynamics (OutEffHop §2, nonparametric §2)",
    ),
    Listing(
        "stanhop-outliers",
        "STanHop-Net with dense/sparse/GSH/OutEffHop/clipped/gated associations: MSE, outliers, W8A8",
        ("tiny", "small", "paper"),
        "Table 2 and the STanHop-Net rows of Table 1 of Hu et al., OutEffHop (ICML 2024)",
    ),
    Listing(
        "theory",
        "numeric checks of the OutEffHop, nonparametric Hopfield and Hyper-SET theorems (pass/fail)",
        ("tiny", "small", "paper"),
        "OutEffHop Lemma 2.1, Thms 3.1-3.4, Cor. 3.2.1, Lemma C.6, App. B.1, §4.1; Nonparametric Thms 3.1, 3.2, 4.1, Lemma 3.1, Def. 3.2, Cor. 4.1.1-4.1.3, Lemma 4.1, Prop. 4.1; Hyper-SET Eqs. 7, 10, Tables 18-19, §3, §3.3",
    ),
    Listing(
        "timeseries-hopfield",
        "Hopfield forecasters (dense, sparse, top-K, window, RF, linear, OutEffHop) on ETT/WTH",
        ("tiny", "small", "paper"),
        "Table 6 and Figure 5 of Hu et al., Nonparametric Modern Hopfield Models (ICML 2025)",
    ),
)


def listings() -> list[Listing]:
    """The listings of every experiment, sorted by name, without importing an experiment module:
    :data:`LISTINGS` and those of the experiments registered so far in this process (tests,
    notebooks and the modules already imported)."""
    found = {listing.name: listing for listing in LISTINGS}
    found.update((name, Listing.of(experiment)) for name, experiment in _REGISTRY.items())
    return [found[name] for name in sorted(found)]
