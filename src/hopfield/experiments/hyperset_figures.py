"""Figures of the Hyper-SET experiments (no experiment is registered here).

* :func:`draw_head_figure`: effective rank and average angle of every subspace (head) along
  the iterations, one column per model (Figs. 9-12 with one column, Figs. 13-14 with four);
* :func:`token_evolution` and :func:`draw_token_evolution`: Fig. 1, the tokens of one sample
  along the iterations, projected onto one subspace (top) and in the full space beside the
  feed-forward directions ("anchor vectors", bottom), shown in 3-D by an uncentred PCA.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from hopfield.experiments.results import RunContext
from hopfield.nn.hyperset import HyperSETEncoder
from hopfield.nn.hyperset_energy import average_angle

__all__ = ["draw_head_figure", "draw_token_evolution", "token_evolution"]

#: The per-head quantities of :func:`draw_head_figure`: (key of a statistics row, axis label).
HEAD_PANELS = (("erank_heads", "effective rank"), ("angle_heads", "average angle (°)"))


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_head_figure(
    ctx: RunContext,
    name: str,
    columns: Sequence[tuple[str, Sequence[dict[str, Any]]]],
    *,
    mark: int | None = None,
) -> str:
    """Save ``name``: effective rank (top row) and average angle (bottom row) of each head
    against t, one line per head, one column per ``(title, rows)``; ``rows`` are
    :func:`~hopfield.experiments.hyperset_common.head_statistics` rows with ``"t"``. A grey line
    marks iteration ``mark`` (the training count L). Returns ``name``."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        2, len(columns), figsize=(0.8 + 3.2 * len(columns), 5.5), squeeze=False
    )
    for column, (title, rows) in enumerate(columns):
        t = [row["t"] for row in rows]
        for line, (key, label) in enumerate(HEAD_PANELS):
            ax = axes[line][column]
            for head, values in enumerate(zip(*(row[key] for row in rows), strict=True)):
                ax.plot(t, values, marker=".", lw=1, label=f"head {head}")
            if mark is not None:
                ax.axvline(mark, color="grey", lw=0.8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("iteration t")
            ax.set_ylabel(label)
            if line == 0:
                ax.set_title(title, fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return ctx.save_figure(fig, name)


def _sphere_pca(points: Tensor) -> tuple[Tensor, float]:
    """Unit vectors ``points`` ``(n, k)`` in 3-D: their projections on the first three right
    singular vectors (an uncentred PCA, which keeps the origin at the sphere's centre),
    renormalised onto the unit sphere ``(n, 3)``, and the share of ``Σ‖point‖²`` the three
    directions capture."""
    _, s, vh = torch.linalg.svd(points, full_matrices=False)
    coords = F.pad(points @ vh[:3].T, (0, 3 - min(3, vh.shape[0])))
    share = float(s[:3].square().sum() / s.square().sum())
    return F.normalize(coords, dim=-1), share


@torch.no_grad()
def token_evolution(
    encoder: HyperSETEncoder, x0: Tensor, iterations: int, head: int = 0
) -> dict[str, Any]:
    """Fig. 1 of one sample ``x0`` ``(1, N, d)`` along ``X_0..X_L`` (``iterations`` L).

    Top: the tokens of subspace ``head`` (gain-free normalised projections, unit length), their
    average angle per t (paper Def. D.2). Bottom: the unit tokens ``x_i/‖x_i‖`` and the unit
    feed-forward directions ``d_m`` (rows of the last layer's ``mlp.weight``, the "anchors"),
    with per t the mean over tokens of ``max_m cos(x_i, d_m)``; the anchors drawn are those
    nearest to some token of ``X_L``. Each panel group is reduced to 3-D by :func:`_sphere_pca`
    over all its iterations together.

    Returns ``{"head", "angle", "alignment"`` (L + 1 floats each), ``"subspace"``, ``"tokens"``
    (``[t][token][xyz]``), ``"anchors"`` (``[anchor][xyz]``), ``"anchor_ids"``,
    ``"pca_share"`` (top, bottom)``}``.
    """
    if x0.dim() != 3 or x0.shape[0] != 1:
        raise ValueError(f"x0 must have shape (1, N, d), got {tuple(x0.shape)}")
    _, states = cast(tuple[Tensor, list[Tensor]], encoder(x0, iterations, return_states=True))
    xs = [x0, *states]
    sub = torch.stack(
        [encoder.layer_at(max(t - 1, 0), iterations).subspace_tokens(x)[0, head]
         for t, x in enumerate(xs)]
    ).double()  # fmt: skip
    sub = F.normalize(sub, dim=-1)  # (T, N, p)
    tokens = F.normalize(torch.cat(xs).double(), dim=-1)  # (T, N, d)
    mlp = encoder.layer_at(iterations - 1, iterations).mlp.weight
    anchors = F.normalize(mlp.double(), dim=-1)  # (M, d)
    cosines = tokens @ anchors.T  # (T, N, M)
    nearest = torch.unique(cosines[-1].argmax(dim=-1))
    steps, n = sub.shape[:2]
    top, top_share = _sphere_pca(sub.reshape(steps * n, -1))
    bottom, bottom_share = _sphere_pca(torch.cat([tokens.reshape(steps * n, -1), anchors[nearest]]))
    return {
        "head": head,
        "angle": average_angle(sub).tolist(),
        "alignment": cosines.max(dim=-1).values.mean(dim=-1).tolist(),
        "subspace": top.reshape(steps, n, 3).tolist(),
        "tokens": bottom[: steps * n].reshape(steps, n, 3).tolist(),
        "anchors": bottom[steps * n :].tolist(),
        "anchor_ids": nearest.tolist(),
        "pca_share": [top_share, bottom_share],
    }


def _sphere(ax: Any) -> None:
    """A light unit-sphere wireframe on the 3-D axes ``ax``."""
    u = torch.linspace(0, 2 * torch.pi, 24)
    v = torch.linspace(0, torch.pi, 12)
    x = torch.outer(torch.cos(u), torch.sin(v))
    y = torch.outer(torch.sin(u), torch.sin(v))
    z = torch.outer(torch.ones_like(u), torch.cos(v))
    ax.plot_wireframe(x.numpy(), y.numpy(), z.numpy(), color="0.85", lw=0.4)
    ax.set_box_aspect((1, 1, 1))
    ax.set_axis_off()


def draw_token_evolution(ctx: RunContext, name: str, evolution: dict[str, Any], what: str) -> str:
    """Save ``name``: :func:`token_evolution` at t = 0, L/2 and L (top: subspace tokens coloured
    by token; bottom: tokens and anchors ×); ``what`` says which model and sample. Returns
    ``name``."""
    plt = _pyplot()
    last = len(evolution["angle"]) - 1
    shown = sorted({0, last // 2, last})
    fig = plt.figure(figsize=(3.2 * len(shown), 6.6))
    anchors = torch.tensor(evolution["anchors"]).reshape(-1, 3)
    for column, t in enumerate(shown):
        points = torch.tensor(evolution["subspace"][t])
        colours = range(len(points))
        ax = fig.add_subplot(2, len(shown), column + 1, projection="3d")
        _sphere(ax)
        ax.scatter(*points.T.numpy(), c=colours, cmap="viridis", s=12)
        ax.set_title(f"t = {t}: head {evolution['head']}, angle {evolution['angle'][t]:.0f}°",
                     fontsize=9)  # fmt: skip
        ax = fig.add_subplot(2, len(shown), len(shown) + column + 1, projection="3d")
        _sphere(ax)
        ax.scatter(*torch.tensor(evolution["tokens"][t]).T.numpy(), c=colours, cmap="viridis", s=12)
        ax.scatter(*anchors.T.numpy(), marker="x", color="black", s=30)
        ax.set_title(f"t = {t}: mean max cos to anchors {evolution['alignment'][t]:.2f}",
                     fontsize=9)  # fmt: skip
    top, bottom = evolution["pca_share"]
    fig.suptitle(
        f"Token evolution (Fig. 1), {what}. Top: tokens in subspace {evolution['head']}; "
        "bottom: tokens and the feed-forward anchors (×) nearest to the final tokens.\n"
        f"3-D by uncentred PCA over all iterations, renormalised onto the sphere (captures "
        f"{100 * top:.0f} % / {100 * bottom:.0f} % of the squared norm).",
        fontsize=8,
    )
    fig.tight_layout()
    return ctx.save_figure(fig, name)
