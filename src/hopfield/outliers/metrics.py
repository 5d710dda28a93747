"""Outlier metrics of OutEffHop / Bondarenko et al.: per-sample kurtosis and infinity norms.

The definitions follow the authors' evaluation code (spec §4.2):

* a module's activation for one sample is its output (element 0 of a tuple output) flattened over
  everything but the batch dimension, e.g. ``(tokens × channels)``;
* per-sample **Pearson kurtosis** ``E[(x - mu)^4] / (s^4 + eps)`` with the unbiased standard
  deviation ``s`` (a Gaussian gives 3, not 0);
* per-sample **infinity norm** ``max |x|``;
* per module, both are averaged over all evaluated samples;
* **avg kurtosis** = arithmetic mean over the selected modules of the per-module means;
* **max inf norm** = maximum over the selected modules of the per-module means.

:class:`ActivationRecorder` keeps only running sums per module, so memory stays flat however many
batches are evaluated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from hopfield.tables import Table

__all__ = [
    "MODULE_SELECTIONS",
    "ActivationRecorder",
    "ModuleSelection",
    "inf_norm",
    "kurtosis",
]


def kurtosis(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Pearson kurtosis of each row: ``x (B, n) -> (B,)``; a Gaussian gives 3.

    ``mu4 / (s**4 + eps)`` with ``mu4`` the (biased) fourth central moment and ``s`` the unbiased
    (``n - 1``) standard deviation, exactly as in the authors' code. It equals
    ``scipy.stats.kurtosis(fisher=False, bias=True) * ((n - 1) / n) ** 2`` up to ``eps``.
    Computed in float64 (float32 fourth powers lose digits for heavy-tailed rows).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"x must have shape (B, n) with n >= 2, got {tuple(x.shape)}")
    x = x.double()
    mu = x.mean(dim=1, keepdim=True)
    s = x.std(dim=1)
    mu4 = ((x - mu) ** 4).mean(dim=1)
    return mu4 / (s**4 + eps)


def inf_norm(x: Tensor) -> Tensor:
    """Infinity norm of each row: ``x (B, n) -> (B,)``, ``max_j |x_j|``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must have shape (B, n), got {tuple(x.shape)}")
    return x.detach().abs().amax(dim=1)


@dataclass(frozen=True)
class ModuleSelection:
    """Which activations to record and how to summarise them.

    Attributes:
        outputs: regular expressions (``re.fullmatch`` on ``named_modules()`` names) of modules
            whose **outputs** are recorded.
        inputs: patterns of modules whose first positional **input** is recorded (recorded under
            ``"<name>:input"``).
        kurtosis: patterns (on the recorded names) of the tensors averaged into ``avg_kurtosis``;
            empty = all recorded outputs.
        inf_norms: summary name -> patterns (on recorded names); each summary is the max over the
            matching tensors of their mean per-sample infinity norm.
    """

    outputs: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    kurtosis: tuple[str, ...] = ()
    inf_norms: dict[str, tuple[str, ...]] = field(default_factory=dict)


_BERT_LAYER = r"(?:bert\.)?encoder\.layer\.\d+"
_OPT_LAYER = r"(?:model\.)?decoder\.layers\.\d+"
_VIT_LAYER = r"(?:vit\.)?(?:encoder\.layer|layers)\.\d+"

#: Per family: component label -> module suffix inside a layer ("" = the block output).
COMPONENTS: dict[str, dict[str, str]] = {
    "bert": {
        "attention out": ".attention.output.dense",
        "attention LN": ".attention.output.LayerNorm",
        "FFN 1": ".intermediate.dense",
        "FFN 2": ".output.dense",
        "FFN LN": ".output.LayerNorm",
    },
    "opt": {
        "attention LN": ".self_attn_layer_norm",
        "attention out": ".self_attn.out_proj",
        "FFN LN": ".final_layer_norm",
        "FFN 1": ".fc1",
        "FFN 2": ".fc2",
        "block": "",
    },
    "vit": {
        "attention LN": ".layernorm_before",
        "attention out": ".attention.o_proj",
        "FFN LN": ".layernorm_after",
        "FFN 1": ".mlp.fc1",
        "FFN 2": ".mlp.fc2",
        "block": "",
    },
}

#: The spec's module selections (§4.2) for the Hugging Face BERT, OPT and ViT models.
MODULE_SELECTIONS: dict[str, ModuleSelection] = {
    # BERT (post-LN): FFN output dense and the LayerNorm after the FFN residual; the LN inputs
    # (FFN output + residual) are recorded for their inf norm only.
    "bert": ModuleSelection(
        outputs=(rf"{_BERT_LAYER}\.output\.dense", rf"{_BERT_LAYER}\.output\.LayerNorm"),
        inputs=(rf"{_BERT_LAYER}\.output\.LayerNorm",),
        kurtosis=(rf"{_BERT_LAYER}\.output\.dense", rf"{_BERT_LAYER}\.output\.LayerNorm"),
        inf_norms={
            "max_ffn_out_inf_norm": (rf"{_BERT_LAYER}\.output\.dense",),
            "max_LN_out_inf_norm": (rf"{_BERT_LAYER}\.output\.LayerNorm",),
            "max_LN_inp_inf_norm": (rf"{_BERT_LAYER}\.output\.LayerNorm:input",),
        },
    ),
    # OPT (pre-LN): final LN and, per layer, block output, fc2, pre-FFN LN, attention output
    # projection and pre-attention LN (61 tensors for 12 layers).
    "opt": ModuleSelection(
        outputs=(
            r"(?:model\.)?decoder\.final_layer_norm",
            _OPT_LAYER,
            rf"{_OPT_LAYER}\.fc2",
            rf"{_OPT_LAYER}\.final_layer_norm",
            rf"{_OPT_LAYER}\.self_attn\.out_proj",
            rf"{_OPT_LAYER}\.self_attn_layer_norm",
        ),
        inf_norms={
            "max_inf_norm": (r".*",),
            "max_ffn_inf_norm": (r".*\.fc.*",),
            "max_layer_inf_norm": (_OPT_LAYER,),
        },
    ),
    # ViT (pre-LN): every module of the blocks, the embeddings and the final LN, except dropout
    # and attention internals (the spec's "every named module except attention internals").
    "vit": ModuleSelection(
        outputs=(
            r"(?:vit\.)?embeddings",
            _VIT_LAYER,
            rf"{_VIT_LAYER}\.(?!.*(?:dropout|gate))(?!attention$).*",
            r"(?:vit\.)?layernorm",
        ),
        inf_norms={
            "max_inf_norm": (r".*",),
            "max_ffn_out_inf_norm": (r".*mlp.*",),
            "max_layer_inf_norm": (_VIT_LAYER,),
        },
    ),
}


def _compile(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    return [re.compile(p) for p in patterns]


def _matches(name: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    return any(p.fullmatch(name) for p in patterns)


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


@dataclass
class _Running:
    """Running sums of one recorded tensor."""

    samples: int = 0
    kurtosis_sum: float = 0.0
    kurtosis_count: int = 0
    inf_norm_sum: float = 0.0
    inf_norm_max: float = 0.0

    def update(self, x: Tensor) -> None:
        flat = x.detach().reshape(x.shape[0], -1)
        norms = inf_norm(flat).double()
        kurt = kurtosis(flat)
        finite = torch.isfinite(kurt)
        self.samples += flat.shape[0]
        self.kurtosis_sum += float(kurt[finite].sum())
        self.kurtosis_count += int(finite.sum())
        self.inf_norm_sum += float(norms.sum())
        self.inf_norm_max = max(self.inf_norm_max, float(norms.max()))

    @property
    def mean_kurtosis(self) -> float:
        return self.kurtosis_sum / self.kurtosis_count if self.kurtosis_count else math.nan

    @property
    def mean_inf_norm(self) -> float:
        return self.inf_norm_sum / self.samples if self.samples else math.nan


class ActivationRecorder:
    """Streams outlier statistics of selected activations through forward hooks.

    Args:
        model: any :class:`torch.nn.Module`.
        modules: ``"bert"``, ``"opt"``, ``"vit"`` (the spec's selections, :data:`MODULE_SELECTIONS`),
            a :class:`ModuleSelection`, or a sequence of name patterns (regular expressions, full
            match) whose outputs are recorded (``avg_kurtosis`` over all of them, ``max_inf_norm``
            over all of them).
        enabled: start recording at once (else call :meth:`attach`).

    Use as a context manager, or :meth:`attach` / :meth:`remove`. Each recorded tensor must have
    the batch as its first dimension. Statistics accumulate until :meth:`reset`.

    Example::

        with ActivationRecorder(model, "bert") as rec:
            for batch in loader:
                model(**batch)
        rec.summary()  # {"avg_kurtosis": ..., "max_ffn_out_inf_norm": ..., ...}
    """

    def __init__(
        self,
        model: nn.Module,
        modules: str | ModuleSelection | Sequence[str],
        *,
        enabled: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(modules, str):
            if modules not in MODULE_SELECTIONS:
                raise ValueError(
                    f"modules must be one of {sorted(MODULE_SELECTIONS)} or a list of patterns, "
                    f"got {modules!r}"
                )
            selection = MODULE_SELECTIONS[modules]
        elif isinstance(modules, ModuleSelection):
            selection = modules
        elif isinstance(modules, Sequence) and all(isinstance(p, str) for p in modules):
            selection = ModuleSelection(outputs=tuple(modules), inf_norms={"max_inf_norm": (".*",)})
        else:
            raise TypeError(
                "modules must be a family name, a ModuleSelection or a list of patterns"
            )
        self.model = model
        self.selection = selection
        outputs, inputs = _compile(selection.outputs), _compile(selection.inputs)
        self._targets: list[tuple[str, nn.Module, bool]] = []
        for name, module in model.named_modules():
            if name and _matches(name, outputs):
                self._targets.append((name, module, False))
            if name and _matches(name, inputs):
                self._targets.append((f"{name}:input", module, True))
        if not self._targets:
            raise ValueError(f"modules: no module of the model matches {selection.outputs}")
        self.stats: dict[str, _Running] = {name: _Running() for name, _, _ in self._targets}
        self._handles: list[RemovableHandle] = []
        if enabled:
            self.attach()

    @property
    def names(self) -> list[str]:
        """Recorded tensor names, in module order."""
        return list(self.stats)

    def attach(self) -> ActivationRecorder:
        """Install the hooks (idempotent)."""
        if self._handles:
            return self
        for name, module, is_input in self._targets:
            if is_input:
                self._handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            else:
                self._handles.append(module.register_forward_hook(self._post_hook(name)))
        return self

    def remove(self) -> None:
        """Remove the hooks; statistics are kept."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset(self) -> None:
        """Forget the statistics recorded so far."""
        self.stats = {name: _Running() for name in self.stats}

    def __enter__(self) -> ActivationRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _record(self, name: str, value: Any) -> None:
        x = _first_tensor(value)
        if x is not None and x.is_floating_point() and x.dim() >= 1 and x[0].numel() >= 2:
            self.stats[name].update(x)

    def _pre_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if args:
                self._record(name, args[0])

        return hook

    def _post_hook(self, name: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._record(name, output)

        return hook

    def _select(self, patterns: Sequence[str]) -> list[str]:
        compiled = _compile(patterns)
        return [n for n in self.stats if self.stats[n].samples and _matches(n, compiled)]

    def summary(self) -> dict[str, float]:
        """``avg_kurtosis``, the selection's inf-norm summaries, and ``samples`` (per tensor)."""
        kurt_names = self._select(self.selection.kurtosis or [".*"])
        if self.selection.kurtosis == ():
            kurt_names = [n for n in kurt_names if not n.endswith(":input")]
        kurt = [self.stats[n].mean_kurtosis for n in kurt_names]
        kurt = [k for k in kurt if math.isfinite(k)]
        out: dict[str, float] = {"avg_kurtosis": sum(kurt) / len(kurt) if kurt else math.nan}
        for key, patterns in self.selection.inf_norms.items():
            norms = [self.stats[n].mean_inf_norm for n in self._select(patterns)]
            out[key] = max(norms) if norms else math.nan
        out["samples"] = float(max((s.samples for s in self.stats.values()), default=0))
        return out

    def table(self, name: str = "activation outliers") -> Table:
        """Per-tensor table: mean kurtosis, mean and max per-sample infinity norm, samples."""
        rows = [
            [n, s.mean_kurtosis, s.mean_inf_norm, s.inf_norm_max, s.samples]
            for n, s in self.stats.items()
        ]
        return Table(
            name=name,
            columns=["tensor", "mean kurtosis", "mean inf norm", "max inf norm", "samples"],
            rows=rows,
            caption="Per-sample Pearson kurtosis and max |x| of each recorded tensor, averaged over samples.",
        )

    def layer_table(self, statistic: str = "mean_inf_norm", name: str | None = None) -> Table:
        """Layers as rows, components (e.g. ``output.dense``, ``fc2``, ``block``) as columns.

        Args:
            statistic: ``"mean_inf_norm"``, ``"mean_kurtosis"`` or ``"max_inf_norm"``.
            name: the table name (default: the statistic).

        Tensors outside numbered layers (e.g. the final LayerNorm) form the row ``"-"``.
        """
        getters = {
            "mean_inf_norm": lambda r: r.mean_inf_norm,
            "mean_kurtosis": lambda r: r.mean_kurtosis,
            "max_inf_norm": lambda r: r.inf_norm_max,
        }
        if statistic not in getters:
            raise ValueError(f"statistic must be one of {sorted(getters)}, got {statistic!r}")
        cells: dict[str, dict[str, float]] = {}
        components: list[str] = []
        for tensor, running in self.stats.items():
            match = _LAYER_INDEX.match(tensor)
            layer, component = (
                (match["index"], match["rest"].lstrip(".")) if match else ("-", tensor)
            )
            component = component or "block"
            if component not in components:
                components.append(component)
            cells.setdefault(layer, {})[component] = getters[statistic](running)
        rows = [[layer] + [row.get(c) for c in components] for layer, row in cells.items()]
        return Table(
            name=name or statistic,
            columns=["layer", *components],
            rows=rows,
            caption=f"{statistic} of each recorded tensor, per layer.",
        )


_LAYER_INDEX = re.compile(r"^.*?\.(?P<index>\d+)(?P<rest>(?:[.:].*)?)$")
