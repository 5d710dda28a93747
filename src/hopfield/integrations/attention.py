"""Outlier-efficient attention functions for Hugging Face ``transformers`` models.

Every variant is a function with the signature of ``transformers``' attention interface,
registered with :class:`transformers.AttentionInterface` (and with the SDPA mask builder in
:class:`transformers.masking_utils.AttentionMaskInterface`) under its namespaced name
``hopfield_<name>`` (``hopfield_softmax1``, ...; :func:`attention_names` lists them), so a model
selects it by ``attn_implementation="hopfield_softmax1"`` without any change to the model's code.
The short names (``softmax1``) are not registered in ``transformers``' global registry, where they
could collide with other packages; this package's own functions (:func:`configure_attention`,
:func:`attention_forward`, ``build_model``) accept both forms:

========================== ==========================================================
name (``hopfield_`` + )     weights
========================== ==========================================================
``softmax``                softmax (the vanilla model, through this module's path)
``softmax1``               Softmax_1 = exp(z) / (1 + Σ exp z) (OutEffHop)
``clipped``                clip((zeta - gamma) · softmax + gamma, 0, 1)
``clipped_softmax1``       clip((zeta - gamma) · Softmax_1 + gamma, 0, 1)
``gated``, ``gated_*``     the above times a per-head, per-token sigmoid gate
========================== ==========================================================

The parameters (``gamma``, ``zeta``) live in ``config.hopfield_attention`` (set by
:func:`configure_attention`), so they are saved by ``save_pretrained``.

Fast paths: softmax and Softmax_1 without probes run through
:func:`hopfield.functional.associate`, i.e. :func:`torch.nn.functional.scaled_dot_product_attention`
with one zero key and zero value appended for Softmax_1 (the mask padded so they are always seen).
Clipped variants compute explicit weights.

Gates: :func:`hopfield.integrations.gates.add_gates` adds a
:class:`hopfield.nn.gates.GatedAttention` as ``module.gate`` to every attention module and a
forward pre-hook that keeps the module's input hidden states for the gate (see that module).

Probes: an attention module may carry a list ``module._hopfield_probes`` of
:class:`AttentionProbe` objects (attention diagnostics, quantizers of scores and weights). With
probes, the explicit path runs and each probe sees (and may replace) the raw scores and the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.functional import ClippedSoftmax, Separation, Sink, Softmax, SoftmaxN, associate
from hopfield.functional.structures import apply_mask, with_causal

__all__ = [
    "PREFIX",
    "VARIANTS",
    "AttentionProbe",
    "AttentionVariant",
    "attention_forward",
    "attention_name",
    "attention_names",
    "check_settings",
    "configure_attention",
    "register_attention_functions",
    "variant_name",
]

CONFIG_KEY = "hopfield_attention"

#: The ``config.json`` key from which ``transformers`` takes a loaded model's attention
#: implementation (``PreTrainedConfig`` reads it as the ``attn_implementation`` argument; it is
#: not kept as an attribute, so :func:`configure_attention` and ``load_model`` set it again).
SAVED_KEY = "attn_implementation"

#: Namespace of the names registered with ``transformers``' attention and mask interfaces.
PREFIX = "hopfield_"


@dataclass(frozen=True)
class AttentionVariant:
    """One attention variant: the base map (``n`` zero logits), clipping and gating."""

    name: str
    n: int
    clipped: bool
    gated: bool


VARIANTS: dict[str, AttentionVariant] = {
    v.name: v
    for v in (
        AttentionVariant("softmax", 0, False, False),
        AttentionVariant("softmax1", 1, False, False),
        AttentionVariant("clipped", 0, True, False),
        AttentionVariant("clipped_softmax1", 1, True, False),
        AttentionVariant("gated", 0, False, True),
        AttentionVariant("gated_softmax1", 1, False, True),
        AttentionVariant("gated_clipped", 0, True, True),
        AttentionVariant("gated_clipped_softmax1", 1, True, True),
    )
}


def variant_name(name: str) -> str | None:
    """The short variant name (``"softmax1"``) of a short or registered name (``"softmax1"``,
    ``"hopfield_softmax1"``); ``None`` if ``name`` is no variant (e.g. ``"sdpa"``)."""
    if not isinstance(name, str):
        return None
    short = name.removeprefix(PREFIX)
    return short if short in VARIANTS else None


def attention_name(variant: str) -> str:
    """The name registered with ``transformers`` for ``variant`` (short or registered form):
    ``attention_name("softmax1") == "hopfield_softmax1"``, the ``attn_implementation`` to ask for."""
    return PREFIX + _variant(variant).name


def attention_names() -> tuple[str, ...]:
    """The names registered with ``transformers``' attention interface, one per variant
    (``("hopfield_softmax", "hopfield_softmax1", ...)``)."""
    return tuple(PREFIX + name for name in VARIANTS)


def _variant(name: str) -> AttentionVariant:
    short = variant_name(name)
    if short is None:
        raise ValueError(
            f"variant must be one of {sorted(VARIANTS)} (or with the prefix {PREFIX!r}), "
            f"got {name!r}"
        )
    return VARIANTS[short]


class AttentionProbe:
    """Observes or transforms the scores and weights of an attention module (explicit path).

    Subclasses override :meth:`scores` and/or :meth:`weights`; both receive the attention module.
    """

    def scores(self, module: nn.Module, scores: Tensor) -> Tensor:
        """Raw scores ``scale · q kᵀ`` ``(B, H, L, S)`` before the mask; returns the scores to use."""
        return scores

    def weights(self, module: nn.Module, weights: Tensor, masked_scores: Tensor) -> Tensor:
        """Weights ``(B, H, L, S)`` after the separation (before dropout); ``masked_scores`` has
        ``-inf`` at masked entries. Returns the weights to use."""
        return weights


def configure_attention(
    config: Any,
    variant: str,
    *,
    gamma: float | None = None,
    zeta: float = 1.0,
    alpha: float | None = None,
    length: int | None = None,
    gate_hidden: int | None = None,
    pi_init: float | None = None,
) -> None:
    """Select ``variant`` on a ``transformers`` config and store its parameters.

    Sets ``config._attn_implementation`` to the registered name (``hopfield_<variant>``),
    ``config.hopfield_attention`` (a dict with the short name as ``variant``) and
    ``config.attn_implementation`` (the registered name); ``save_pretrained`` writes both into
    ``config.json``. On a hopfield config (:mod:`hopfield.integrations.auto`, as
    :func:`build_model` uses) the saved model loads back with its variant and gates through
    ``transformers``' Auto classes. On a stock config (Llama, Qwen2, Mistral, gpt-oss, ...)
    ``AutoModel*.from_pretrained`` reads ``attn_implementation`` from ``config.json`` and restores
    the variant and its clipping parameters after ``import hopfield.integrations`` (without the
    import, ``transformers`` refuses the unknown name), but builds no gates: ``load_model`` restores
    everything, gates included.

    Args:
        config: a ``transformers.PretrainedConfig``.
        variant: one of :data:`VARIANTS`, short (``"softmax1"``) or registered
            (``"hopfield_softmax1"``).
        gamma, zeta: clipping parameters (clipped variants), ``gamma <= 0 <= 1 <= zeta``.
        alpha, length: the alternative parametrisation ``gamma = -alpha / length``.
        gate_hidden, pi_init: the gate design (gated variants), see
            :class:`hopfield.nn.gates.GatedAttention`.
    """
    spec = _variant(variant)
    variant = spec.name
    settings: dict[str, Any] = {"variant": variant}
    if spec.clipped:
        if (gamma is None) == (alpha is None):
            raise ValueError(
                f"variant {variant!r} needs exactly one of gamma or alpha (with length)"
            )
        if alpha is not None:
            if length is None:
                raise ValueError("alpha needs length (the sequence length T): gamma = -alpha / T")
            clip = ClippedSoftmax.from_alpha(alpha, length, zeta)
        else:
            clip = ClippedSoftmax(gamma=float(gamma), zeta=zeta)  # type: ignore[arg-type]
        settings.update(gamma=clip.gamma, zeta=clip.zeta)
    elif gamma is not None or alpha is not None:
        raise ValueError(f"gamma/alpha apply to clipped variants only, not {variant!r}")
    if spec.gated:
        settings.update(gate_hidden=gate_hidden, pi_init=pi_init)
    elif gate_hidden is not None or pi_init is not None:
        raise ValueError(f"gate_hidden/pi_init apply to gated variants only, not {variant!r}")
    setattr(config, CONFIG_KEY, settings)
    config._attn_implementation = attention_name(variant)
    setattr(config, SAVED_KEY, attention_name(variant))


def check_settings(settings: Any) -> None:
    """Check a ``config.hopfield_attention`` value (e.g. read back from ``config.json``).

    Raises:
        ValueError: not a dict with a known ``variant``, or a clipped variant without ``gamma`` and
            ``zeta``.
    """
    if not isinstance(settings, dict) or "variant" not in settings:
        raise ValueError(
            f"config.{CONFIG_KEY} must be a dict with a 'variant' (see configure_attention), "
            f"got {settings!r}"
        )
    if variant_name(settings["variant"]) is None:
        raise ValueError(
            f"config.{CONFIG_KEY}: variant must be one of {sorted(VARIANTS)}, "
            f"got {settings['variant']!r}"
        )
    if _variant(settings["variant"]).clipped and not {"gamma", "zeta"} <= settings.keys():
        raise ValueError(
            f"config.{CONFIG_KEY}: variant {settings['variant']!r} needs gamma and zeta, "
            f"got {settings!r}"
        )


def _separation(
    spec: AttentionVariant, module: nn.Module, sinks: Any = None, heads: int = 0
) -> Separation:
    """The variant's separation; with the model's learned sink logits ``sinks`` ``(H,)`` (gpt-oss's
    ``s_aux``) a :class:`~hopfield.functional.Sink` with those logits (gradients flow to them)
    takes the place of the fixed sink logit 0 of the sink variants (plain, clipped, gated)."""
    base: Sink = SoftmaxN(1.0) if spec.n else Softmax()
    if sinks is not None:
        if not spec.n:
            sink_variants = sorted(name for name, v in VARIANTS.items() if v.n)
            raise ValueError(
                f"{type(module).__name__} has learned attention sinks (s_aux, e.g. gpt-oss); "
                f"attention {spec.name!r} has no sink: use a sink variant "
                f"({', '.join(sink_variants)}), whose sink logit becomes the model's learned one"
            )
        _check_sinks(sinks, heads)
        base = Sink(sinks)
    if not spec.clipped:
        return base
    settings = getattr(getattr(module, "config", None), CONFIG_KEY, None)
    if not isinstance(settings, dict) or "gamma" not in settings:
        raise ValueError(
            f"attention {spec.name!r} needs gamma and zeta: call "
            "hopfield.integrations.configure_attention(config, ...) before building the model"
        )
    return ClippedSoftmax(gamma=settings["gamma"], zeta=settings["zeta"], base=base)


def _check_sinks(sinks: Any, heads: int) -> None:
    if not isinstance(sinks, Tensor) or sinks.shape != (heads,) or not sinks.is_floating_point():
        raise ValueError(
            f"s_aux (the learned sink logits) must be a float tensor ({heads},), one per query "
            f"head, got {tuple(sinks.shape) if isinstance(sinks, Tensor) else type(sinks).__name__}"
        )


def _explicit(
    module: nn.Module,
    probes: list[AttentionProbe],
    separation: Separation,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float,
    dropout: float,
) -> tuple[Tensor, Tensor]:
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    for probe in probes:
        scores = probe.scores(module, scores)
    if causal:
        mask = with_causal(mask, query.shape[-2], key.shape[-2], query.device)
    masked = apply_mask(scores, mask)
    weights = separation(masked)
    for probe in probes:
        weights = probe.weights(module, weights, masked)
    dropped = F.dropout(weights, dropout) if dropout > 0 else weights
    return torch.matmul(dropped, value), weights


def _repeat_kv(query: Tensor, states: Tensor) -> Tensor:
    """Grouped-query attention: repeat each of the ``Hkv`` key/value heads ``H / Hkv`` times,
    ``(B, Hkv, S, E) → (B, H, S, E)``, so query head ``h`` reads key/value head ``h // (H / Hkv)``
    (``transformers``' ``repeat_kv``, i.e. ``repeat_interleave`` over the heads)."""
    heads, kv_heads = query.shape[1], states.shape[1]
    if kv_heads == heads:
        return states
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"grouped-query attention needs the query heads ({heads}) to be a multiple of the "
            f"key/value heads ({kv_heads})"
        )
    batch, _, length, width = states.shape
    groups = heads // kv_heads
    expanded = states[:, :, None].expand(batch, kv_heads, groups, length, width)
    return expanded.reshape(batch, heads, length, width)


def _weights_asked(module: nn.Module, kwargs: dict[str, Any]) -> bool:
    """Whether this forward pass asks for the attention weights: ``output_attentions`` passed
    on to the attention function, else the outputs ``transformers`` records in this forward (its
    output-capturing context, which holds ``"attentions"`` when ``output_attentions=True`` was
    given to the model: attention modules such as OPT's take that argument by name and do not
    pass it on), else ``module.config.output_attentions``."""
    asked = kwargs.get("output_attentions")
    if asked is not None:
        return bool(asked)
    recorded = _recorded_outputs()
    if recorded is not None and "attentions" in recorded:
        return True
    return bool(getattr(getattr(module, "config", None), "output_attentions", False))


def _recorded_outputs() -> dict[str, Any] | None:
    """The outputs the running ``transformers`` forward records (``None``: none, or a
    ``transformers`` without output capturing)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    recorded = _active_collector.get()
    return recorded if isinstance(recorded, dict) else None


def attention_forward(
    variant: str,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The attention computation of ``variant`` in the ``transformers`` interface.

    Args:
        variant: a name of :data:`VARIANTS`, short or registered (``hopfield_<name>``).
        module: the calling attention module (its ``config``, ``is_causal``, gate and probes).
        query: ``(B, H, L, E)``; key: ``(B, Hkv, S, E)``; value: ``(B, Hkv, S, Ev)``. With
            grouped-query attention (``Hkv < H``, Llama/Qwen/Mistral/gpt-oss-style
            ``num_key_value_heads``) each key/value head serves ``H / Hkv`` query heads, as in
            ``transformers``' ``repeat_kv``.
        attention_mask: ``None``, boolean ``(B, 1, L, S)`` (``True`` = attend) or additive float.
        dropout: attention dropout probability (the model passes 0 in eval mode).
        scaling: the logit scale (``None`` = ``1/sqrt(E)``).
        is_causal: overrides ``module.is_causal`` (used only when no mask is given).
        **kwargs: from the model; ``output_attentions`` (or, where the attention module does
            not pass it on, the outputs ``transformers`` records in this forward, or
            ``module.config.output_attentions``) asks for the weights; ``s_aux`` (gpt-oss's learned sink logits ``(H,)``) replaces
            the sink variants' fixed sink logit 0 (a :class:`~hopfield.functional.Sink` with
            those logits, on the same fused paths; a variant without a sink refuses it);
            ``softcap`` is refused.

    Returns:
        ``(output (B, L, H, Ev), weights (B, H, L, S) or None)``. The weights are returned where
        they are computed: always for the clipped variants and with probes (explicit weights),
        and for ``softmax``/``softmax1`` (and their gated forms) when ``output_attentions`` is
        asked, which then leave the fused SDPA path for the explicit one; otherwise ``None``.
    """
    spec = _variant(variant)
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"attention {variant!r} does not support softcap (logit soft-capping); "
            "use attn_implementation='eager' for this model"
        )
    sinks = kwargs.get("s_aux")
    separation = _separation(spec, module, sinks, query.shape[1])
    key, value = _repeat_kv(query, key), _repeat_kv(query, value)
    causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
    causal = causal and attention_mask is None and query.shape[-2] > 1
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    probes: list[AttentionProbe] = getattr(module, "_hopfield_probes", [])
    weights: Tensor | None = None
    if probes:
        out, weights = _explicit(
            module, probes, separation, query, key, value, attention_mask, causal, scale, dropout
        )
    else:
        result = associate(
            query,
            key,
            value,
            separation=separation,
            scale=scale,
            mask=attention_mask,
            causal=causal,
            dropout=dropout,
            training=True,
            return_weights=spec.clipped or _weights_asked(module, kwargs),
        )
        out, weights = result if isinstance(result, tuple) else (result, None)
    if spec.gated:
        gate_input = module.__dict__.pop("_hopfield_gate_input", None)
        gate = getattr(module, "gate", None)
        if gate is None or gate_input is None:
            raise RuntimeError(
                f"attention {variant!r} needs a gate on {type(module).__name__}: build the model "
                "with hopfield.integrations.build_model, load a checkpoint with load_model, or "
                "call add_gates(model)"
            )
        out = gate(gate_input, out)
    return out.transpose(1, 2).contiguous(), weights


def _named(variant: str) -> Callable[..., tuple[Tensor, Tensor | None]]:
    name = attention_name(variant)

    def forward(
        module: nn.Module, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor | None]:
        _keep_saved_name(getattr(module, "config", None), name)
        return attention_forward(variant, module, query, key, value, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = f"{PREFIX}{variant}_attention_forward"
    forward.__doc__ = f"``{variant}`` attention (see :func:`attention_forward`)."
    return forward


def _keep_saved_name(config: Any, name: str) -> None:
    """Set ``config.attn_implementation`` to ``name`` when the model runs with it and the key is
    missing. ``transformers`` consumes the key when it reads a ``config.json`` (a model loaded
    through ``AutoModel*.from_pretrained`` keeps only ``config._attn_implementation``), so without
    this a checkpoint saved again from such a model would come back as ``sdpa``."""
    if (
        config is not None
        and getattr(config, "_attn_implementation", None) == name
        and getattr(config, SAVED_KEY, None) != name
    ):
        setattr(config, SAVED_KEY, name)


#: The attention function of each registered name (``hopfield_<variant>``).
ATTENTION_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, Tensor | None]]] = {
    PREFIX + name: _named(name) for name in VARIANTS
}


def register_attention_functions() -> None:
    """Register every variant as ``hopfield_<name>`` (:func:`attention_names`) with
    ``transformers``' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, function in ATTENTION_FUNCTIONS.items():
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)
