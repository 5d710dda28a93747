"""Gates for the ``gated*`` attention variants, added to a built ``transformers`` model.

Design (no change to the model's code): :func:`add_gates` gives every attention module

* a :class:`hopfield.nn.gates.GatedAttention` submodule ``module.gate`` (so its parameters are
  trained, counted and saved with the model, under ``...<attention>.gate.*``), and
* a forward pre-hook that stores the module's input hidden states ``(B, L, d_model)`` (its first
  positional argument, or the ``hidden_states`` keyword) on the module.

The registered attention function (:func:`hopfield.integrations.attention.attention_forward`)
pops the stored input and multiplies each head's output by ``sigmoid(G_h(x_h))`` before the heads
are merged, i.e. before the output projection, as in Bondarenko et al. (2023). The stored
reference is removed at once, so nothing outlives the forward pass.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from hopfield.nn.gates import GatedAttention

__all__ = ["ATTENTION_CLASSES", "add_gates", "attention_modules"]

#: Class names of attention modules tested with the gates and probes (BERT, OPT, ViT, and the
#: grouped-query decoders Llama, Qwen2, Mistral). Not a limit: :func:`attention_modules` finds the
#: attention modules of any ``transformers`` model by the rule given there.
ATTENTION_CLASSES: tuple[str, ...] = (
    "BertSelfAttention",
    "OPTAttention",
    "ViTAttention",
    "LlamaAttention",
    "Qwen2Attention",
    "MistralAttention",
)


def _is_attention(module: nn.Module) -> bool:
    return type(module).__name__.endswith("Attention") and hasattr(module, "config")


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every attention module of a ``transformers`` model.

    An attention module is one whose class name ends in ``Attention``, that has a ``config``
    (``transformers``' attention modules keep the model config), and that contains no other such
    module: the innermost one, which calls the attention interface (``BertSelfAttention`` inside
    ``BertAttention``; ``OPTAttention``, ``ViTAttention``, ``LlamaAttention``, ... themselves).
    """
    return [
        (n, m)
        for n, m in model.named_modules()
        if _is_attention(m) and not any(_is_attention(c) for c in m.modules() if c is not m)
    ]


def _store_gate_input(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, Tensor):
        raise TypeError(f"{type(module).__name__}: the gate needs the input hidden_states tensor")
    module.__dict__["_hopfield_gate_input"] = hidden


def add_gates(model: nn.Module, *, hidden: int | None = None, pi_init: float | None = None) -> int:
    """Add a per-head, per-token gate to every attention module of ``model``.

    Args:
        model: a ``transformers`` model whose attention modules (see :func:`attention_modules`)
            take the input hidden states ``(B, L, hidden_size)`` first and have
            ``config.num_attention_heads`` query heads (e.g. BERT, OPT, ViT, Llama).
        hidden: hidden width of the MLP gate ``Linear(d_head, hidden) → ReLU → Linear(hidden, 1)``
            (``None``: a linear gate ``Linear(d_head, 1)``).
        pi_init: initial gate probability: the output bias starts at ``logit(pi_init)``.

    Returns:
        The number of parameters added.
    """
    modules = attention_modules(model)
    if not modules:
        raise ValueError(
            "model: no attention module (a submodule whose class name ends in 'Attention' and "
            "that has a config)"
        )
    added = 0
    for name, module in modules:
        if hasattr(module, "gate"):
            raise ValueError(f"model: {name} already has a gate")
        config: Any = module.config
        reference = next(module.parameters())
        gate = GatedAttention(
            config.hidden_size,
            config.num_attention_heads,
            kind="conditional_per_token",
            hidden=hidden,
            pi_init=pi_init,
            device=reference.device,
            dtype=reference.dtype,
        )
        module.add_module("gate", gate)
        module.register_forward_pre_hook(_store_gate_input, with_kwargs=True)
        added += sum(p.numel() for p in gate.parameters())
    return added
