"""Hopfield forecasters and the training loop shared by the time-series experiments.

:class:`HopfieldForecaster` is the nonparametric paper's "simplest possible" model (Appendix G.4):
a value embedding of every time step, one Hopfield layer over the steps (any separation and
structure: dense, sparse, top-k, window, linear, random features, OutEffHop), Hopfield pooling of
all steps into one vector, and a linear head to the whole horizon.

:func:`fit` trains any forecaster ``(B, T, C_in) -> (B, τ, C_out)`` with MSE, gradient clipping,
an epoch-level learning-rate schedule, early stopping on the validation MSE (a strict decrease
is an improvement; the best weights are restored) and an optional checkpoint file from which a
stopped run resumes. :func:`evaluate` gives the exact element-wise MSE and MAE of a split.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hopfield.data.timeseries import ForecastSplits, WindowDataset
from hopfield.functional import Separation
from hopfield.functional.structures import Structure
from hopfield.nn.hopfield import Hopfield, HopfieldPooling

__all__ = [
    "FitResult",
    "HopfieldForecaster",
    "TrainConfig",
    "evaluate",
    "fit",
    "learning_rate",
]


class HopfieldForecaster(nn.Module):
    """Embedding → Hopfield layer → Hopfield pooling → linear head (nonparametric paper, G.4).

    Every time step is one pattern: ``Linear(C_in → d) + LayerNorm``; one self-associating
    :class:`~hopfield.nn.Hopfield` layer (values tied to keys, ``V = Y W_K W_V``, as in the
    paper's layer (F.2)); GELU and LayerNorm; :class:`~hopfield.nn.HopfieldPooling` with one learned
    query over all steps, then LayerNorm; ``Linear(d → τ·C_out)``.

    Args:
        out_len: horizon ``τ``.
        num_inputs: input channels ``C_in`` (1 in the paper's univariate setting).
        num_targets: output channels ``C_out`` (``num_inputs`` by default).
        d_model: hidden size ``d``.
        num_heads: heads of both Hopfield layers (``d`` must be divisible by it).
        separation, structure: of the Hopfield layer (softmax and dense by default).
        pooling_separation, pooling_structure: of the pooling layer (the layer's by default).
        scale: ``β`` of both layers (``None``: ``1/sqrt(d/num_heads)``).
        dropout: dropout on the association weights.
    """

    def __init__(
        self,
        out_len: int,
        num_inputs: int = 1,
        num_targets: int | None = None,
        d_model: int = 64,
        num_heads: int = 4,
        separation: Separation | None = None,
        structure: Structure | None = None,
        pooling_separation: Separation | None = None,
        pooling_structure: Structure | None = None,
        scale: float | None = None,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if out_len < 1 or num_inputs < 1:
            raise ValueError(f"out_len and num_inputs must be >= 1, got {out_len}, {num_inputs}")
        if d_model < 1 or num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.out_len = out_len
        self.num_inputs = num_inputs
        self.num_targets = num_inputs if num_targets is None else num_targets
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        head = d_model // num_heads
        common: dict[str, Any] = {
            "num_heads": num_heads,
            "hidden_size": head,
            "pattern_size": head,
            "output_size": d_model,
            "scale": scale,
            "tie_values_to_keys": True,
            "dropout": dropout,
            **factory,
        }
        self.embedding = nn.Linear(num_inputs, d_model, **factory)
        self.embedding_norm = nn.LayerNorm(d_model, **factory)
        layer_kwargs: dict[str, Any] = {}
        if separation is not None:
            layer_kwargs["separation"] = separation
        if structure is not None:
            layer_kwargs["structure"] = structure
        self.hopfield = Hopfield(d_model, **common, **layer_kwargs)
        self.hopfield_norm = nn.LayerNorm(d_model, **factory)
        pool_separation = separation if pooling_separation is None else pooling_separation
        pool_structure = structure if pooling_structure is None else pooling_structure
        pool_kwargs: dict[str, Any] = {}
        if pool_separation is not None:
            pool_kwargs["separation"] = copy.deepcopy(pool_separation)
        if pool_structure is not None:
            pool_kwargs["structure"] = copy.deepcopy(pool_structure)
        self.pooling = HopfieldPooling(d_model, quantity=1, **common, **pool_kwargs)
        self.pooling_norm = nn.LayerNorm(d_model, **factory)
        self.head = nn.Linear(d_model, out_len * self.num_targets, **factory)

    def reset_parameters(self) -> None:
        """Re-initialise every sub-module."""
        for module in (self.embedding, self.embedding_norm, self.hopfield_norm, self.pooling_norm):
            module.reset_parameters()
        self.hopfield.reset_parameters()
        self.pooling.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        """Forecast ``(B, τ, C_out)`` from the window ``x (B, T, C_in)``."""
        if x.dim() != 3 or x.shape[-1] != self.num_inputs:
            raise ValueError(f"x must be (B, T, {self.num_inputs}), got {tuple(x.shape)}")
        h = self.embedding_norm(self.embedding(x))  # (B, T, d)
        h = self.hopfield_norm(nn.functional.gelu(self.hopfield(h)))  # (B, T, d)
        pooled = self.pooling_norm(self.pooling(h)).flatten(1)  # (B, d)
        return self.head(pooled).view(x.shape[0], self.out_len, self.num_targets)


@dataclass
class TrainConfig:
    """Optimisation of :func:`fit`.

    Attributes:
        epochs: maximum number of epochs.
        batch_size: training and evaluation batch size.
        lr: base learning rate.
        optimizer: ``"adam"`` or ``"adamw"``.
        weight_decay: of the optimiser.
        schedule: ``"type1"`` (halve after epochs 2, 4, 6, 8, 10; STanHop/Crossformer),
            ``"cosine"`` (cosine annealing over ``epochs``) or ``"constant"``.
        patience: stop after this many epochs without a strict validation improvement.
        grad_clip: maximum gradient norm (``0``: no clipping).
        max_train_batches: cap on training batches per epoch (``None``: all; tiny presets).
        max_eval_batches: cap on evaluation batches (``None``: all).
    """

    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    schedule: str = "type1"
    patience: int = 3
    grad_clip: float = 5.0
    max_train_batches: int | None = None
    max_eval_batches: int | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"optimizer must be 'adam' or 'adamw', got {self.optimizer!r}")
        if self.schedule not in ("type1", "cosine", "constant"):
            raise ValueError(
                f"schedule must be 'type1', 'cosine' or 'constant', got {self.schedule!r}"
            )
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1:
            raise ValueError("epochs, batch_size and patience must be >= 1")


def learning_rate(schedule: str, base: float, epoch: int, epochs: int) -> float:
    """Learning rate of (1-based) ``epoch`` under ``schedule`` (see :class:`TrainConfig`)."""
    if epoch < 1:
        raise ValueError(f"epoch must be >= 1, got {epoch}")
    if schedule == "type1":
        return base * 0.5 ** min((epoch - 1) // 2, 5)
    if schedule == "cosine":
        return base * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / max(epochs, 1)))
    if schedule == "constant":
        return base
    raise ValueError(f"schedule must be 'type1', 'cosine' or 'constant', got {schedule!r}")


def _device(model: nn.Module) -> torch.device:
    """Where the model's parameters live (batches are moved there)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def _limited(batches: Iterable[Any], limit: int | None) -> Iterator[Any]:
    for i, item in enumerate(batches):
        if limit is not None and i >= limit:
            return
        yield item


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: WindowDataset,
    batch_size: int = 256,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Element-wise mean MSE and MAE of ``model`` over ``dataset`` (unshuffled, eval mode)."""
    was_training = model.training
    device = _device(model)
    model.eval()
    sq = ab = 0.0
    count = 0
    try:
        for x_cpu, y_cpu in _limited(dataset.batches(batch_size), max_batches):
            x, y = x_cpu.to(device), y_cpu.to(device)
            diff = (model(x).float() - y.float()).double()
            sq += float(diff.square().sum())
            ab += float(diff.abs().sum())
            count += diff.numel()
    finally:
        model.train(was_training)
    return {"mse": sq / count, "mae": ab / count}


@dataclass
class FitResult:
    """What :func:`fit` returns.

    Attributes:
        test: test MSE/MAE of the restored best model.
        val: validation MSE/MAE of that model.
        best_epoch: the epoch (1-based) whose weights were restored.
        epochs_run: epochs trained in total.
        history: per epoch ``{"epoch", "lr", "train_mse", "val_mse", "seconds", "cpu_seconds"}``
            (wall and process CPU time of the training batches; CPU time is the robust one on a
            shared machine).
    """

    test: dict[str, float]
    val: dict[str, float]
    best_epoch: int
    epochs_run: int
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def seconds_per_epoch(self) -> float:
        """Mean training wall time per epoch."""
        return sum(h["seconds"] for h in self.history) / max(len(self.history), 1)

    @property
    def cpu_seconds_per_epoch(self) -> float:
        """Mean process CPU time per training epoch (all threads)."""
        return sum(h["cpu_seconds"] for h in self.history) / max(len(self.history), 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "seconds_per_epoch": self.seconds_per_epoch,
            "cpu_seconds_per_epoch": self.cpu_seconds_per_epoch,
        }


def fit(
    model: nn.Module,
    splits: ForecastSplits,
    config: TrainConfig,
    *,
    generator: torch.Generator | None = None,
    checkpoint: Path | str | None = None,
    progress: Callable[[Iterable[int], int, str], Iterable[int]] | None = None,
) -> FitResult:
    """Train ``model`` on ``splits.train`` with early stopping on ``splits.val``.

    Args:
        model: ``(B, T, C_in) -> (B, τ, C_out)``.
        splits: the three window datasets.
        config: optimisation settings.
        generator: shuffles the training windows (seed it for reproducible runs).
        checkpoint: a file written after every epoch; if it exists, training resumes from it and
            the file is removed at the end.
        progress: ``progress(iterable, total, desc)`` wraps the epoch loop (e.g. ``ctx.track``).

    Returns:
        a :class:`FitResult` for the best-validation weights, which are loaded into ``model``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    device = _device(model)
    opt_cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(params, lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(0) if generator is None else generator
    state: dict[str, Any] = {
        "epoch": 0,
        "best_val": math.inf,
        "best_epoch": 0,
        "bad_epochs": 0,
        "history": [],
        "best_state": copy.deepcopy(model.state_dict()),
    }
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=False, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"].cpu())
        state = saved["state"]
    epochs: Iterable[int] = range(state["epoch"] + 1, config.epochs + 1)
    if progress is not None:
        epochs = progress(epochs, config.epochs - state["epoch"], "epochs")
    for epoch in epochs:
        if state["bad_epochs"] >= config.patience:
            break
        lr = learning_rate(config.schedule, config.lr, epoch, config.epochs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()
        started, started_cpu = time.perf_counter(), time.process_time()
        total, n = 0.0, 0
        batches = splits.train.batches(config.batch_size, shuffle=True, generator=generator)
        for x_cpu, y_cpu in _limited(batches, config.max_train_batches):
            x, y = x_cpu.to(device), y_cpu.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if config.grad_clip > 0:
                nn.utils.clip_grad_norm_(params, config.grad_clip)
            optimizer.step()
            total += float(loss.detach()) * x.shape[0]
            n += x.shape[0]
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
        val = evaluate(model, splits.val, config.batch_size, config.max_eval_batches)["mse"]
        if val < state["best_val"]:
            state.update(best_val=val, best_epoch=epoch, bad_epochs=0)
            state["best_state"] = copy.deepcopy(model.state_dict())
        else:
            state["bad_epochs"] += 1
        state["epoch"] = epoch
        state["history"].append(
            {
                "epoch": epoch,
                "lr": lr,
                "train_mse": total / max(n, 1),
                "val_mse": val,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
            }
        )
        if path is not None:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(),
                    "state": state,
                },
                path,
            )
    model.load_state_dict(state["best_state"])
    result = FitResult(
        test=evaluate(model, splits.test, config.batch_size, config.max_eval_batches),
        val=evaluate(model, splits.val, config.batch_size, config.max_eval_batches),
        best_epoch=state["best_epoch"],
        epochs_run=state["epoch"],
        history=state["history"],
    )
    if path is not None and path.exists():
        path.unlink()
    return result
