"""docs/migration.md runs, and the Hopfield layer takes unbatched input as nn.MultiheadAttention."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from hopfield.nn import Hopfield, HopfieldOutput, OutEffHop

DOC = Path(__file__).resolve().parents[1] / "docs" / "migration.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_migration_doc_has_examples() -> None:
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_migration_example_runs(index: int) -> None:
    exec(compile(BLOCKS[index], f"{DOC}:block{index}", "exec"), {})


def _pair(batch_first: bool, zero_attn: bool = False) -> tuple[nn.MultiheadAttention, Hopfield]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(
        8, 2, batch_first=batch_first, add_zero_attn=zero_attn, dtype=torch.float64
    )
    hop = (OutEffHop if zero_attn else Hopfield)(8, 2, batch_first=batch_first, dtype=torch.float64)
    with torch.no_grad():
        for i, proj in enumerate((hop.q_proj, hop.k_proj, hop.v_proj)):
            assert proj is not None and proj.bias is not None
            proj.weight.copy_(mha.in_proj_weight[8 * i : 8 * (i + 1)])
            proj.bias.copy_(mha.in_proj_bias[8 * i : 8 * (i + 1)])
        assert hop.out_proj is not None
        hop.out_proj.load_state_dict(mha.out_proj.state_dict())
    return mha, hop


@pytest.mark.parametrize("zero_attn", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_unbatched_input_as_multihead_attention(batch_first: bool, zero_attn: bool) -> None:
    mha, hop = _pair(batch_first, zero_attn)
    g = torch.Generator().manual_seed(1)
    query = torch.randn(4, 8, generator=g, dtype=torch.float64)
    key = torch.randn(6, 8, generator=g, dtype=torch.float64)
    value = torch.randn(6, 8, generator=g, dtype=torch.float64)
    padding = torch.tensor([False, False, False, True, False, True])
    banned = torch.zeros(4, 6, dtype=torch.bool)
    banned[2, :2] = True
    heads_mask = torch.zeros(2, 4, 6).masked_fill(torch.rand(2, 4, 6, generator=g) > 0.8, -math.inf)
    heads_mask[..., 0] = 0.0  # every row keeps a key
    for masks in (
        {},
        {"key_padding_mask": padding},
        {"attn_mask": banned},
        {"attn_mask": heads_mask.double()},
        {"key_padding_mask": padding, "attn_mask": banned},
    ):
        out, weights = mha(query, key, value, average_attn_weights=False, **masks)
        ours = hop((key, query, value), return_weights=True, **masks)
        assert isinstance(ours, HopfieldOutput)
        assert ours.output.shape == (4, 8) and ours.weights is not None
        torch.testing.assert_close(ours.output, out)
        # (H, L, S); add_zero_attn's weights have one more column, the zero key's
        torch.testing.assert_close(ours.weights, weights[..., :6])
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(hop(x), mha(x, x, x)[0])
    heads = hop(x, return_heads=True).heads
    assert heads is not None and heads.shape == (2, 5, 4)
    batched = hop(x.unsqueeze(0 if batch_first else 1))
    torch.testing.assert_close(hop(x), batched.squeeze(0 if batch_first else 1))


def test_mixed_unbatched_and_batched_inputs_are_refused() -> None:
    hop = Hopfield(8, 2)
    with pytest.raises(ValueError, match="3-D"):
        hop((torch.randn(6, 8), torch.randn(1, 4, 8), torch.randn(6, 8)))
