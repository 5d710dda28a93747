"""The decisive Softmax_1 outlier test: the ``decisive`` preset of ``outlier-formation``.

OutEffHop's central claim is that Softmax_1 removes the attention outliers that break 8-bit
quantization. The ``small`` comparison of ``outlier-formation`` could neither confirm nor refute
it: over 3 seeds nothing was significant, and its positive control (gated attention) did not
remove the outliers either, so the recipe's outliers were not of the attention no-op kind. This
module runs a protocol fixed before any of its runs (docs/outlier-formation.md, "The decisive
test"):

* **Arms** (``Config.arms``: name -> config overrides): the data (synthetic streams with
  ``recall_rate = 1.0``, so the token after a delimiter is certain and the output-shaping motive
  for outliers is gone; WikiText-2 with BPE and ``</s>`` between sentences) crossed with the
  optimiser regime (paper-like: AdamW, warm-up, cosine to 10 %, weight decay on the LayerNorm
  gains; stress: the constant 1e-2 of the ``small`` recipe).
* **Variants** softmax, softmax1, gated (the positive control) and gated_softmax1 over paired
  training seeds (the same seed gives every variant the same initialisation of the shared
  weights and the same data order).
* **Validity gate** (:func:`gate`), per arm: the vanilla model's residual stream reaches
  ``max |x| >= 20 ×`` the median RMS in some block before the last and W8A8 costs >= 2 %
  (medians over seeds), and gated attention cuts that max |x| by >= 50 % in >= 5/6 of the
  seeds. An arm failing the gate is *uninformative*; with ``gate_first`` its Softmax_1 variants
  are not trained at all.
* **Primary endpoint** (:func:`endpoints`): per seed, the log-ratio (softmax1 / softmax) of the
  residual stream's max |x| over blocks 0 … L−2; paired t and Wilcoxon with a 95 % interval;
  "reduction" only if the interval lies below 0, "no paper-sized effect" if it excludes
  −50 % (a ratio of 0.5). Secondary: average kurtosis and max inf norm over all tensors and
  per tensor type (residual stream, attention outputs), the W8A8 cost with min–max and with
  percentile calibration, and the quantizer ablation.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from hopfield.experiments.outlier_formation import (
    VARIANT_NAMES,
    Config,
    _compare_tables,
    _data,
    _gap_pct,
    compare_recipes,
)
from hopfield.experiments.results import Results, RunContext, Table
from hopfield.stats import MIN_RUNS, compare_paired

__all__ = [
    "ENDPOINTS",
    "GATE",
    "REQUIRED_VARIANTS",
    "Endpoint",
    "Gate",
    "GateRule",
    "ablation_table",
    "arm_config",
    "endpoints",
    "gate",
    "residual_max",
    "run_arms",
    "tensor_stats",
]

Run = Mapping[str, Any]


@dataclass(frozen=True)
class GateRule:
    """The thresholds of the validity gate (see :func:`gate`)."""

    norm_ratio: float = 20.0
    w8a8_gap_pct: float = 2.0
    gated_cut: float = 0.5
    seed_fraction: float = 5 / 6


#: The pre-registered gate.
GATE = GateRule()

#: Softmax_1 against its softmax counterpart, and the positive control against vanilla.
PAIRS: tuple[tuple[str, str], ...] = (
    ("softmax", "softmax1"),
    ("gated", "gated_softmax1"),
    ("softmax", "gated"),
)

#: A paper-sized effect: Softmax_1 halves the outliers (the paper's OPT reductions are 86–99.9 %).
PAPER_SIZED_RATIO = 0.5

_BLOCK = re.compile(r"(?:model\.)?decoder\.layers\.(\d+)")
_ATTENTION_OUT = re.compile(r"(?:model\.)?decoder\.layers\.\d+\.self_attn\.out_proj")


def _tensors(run: Run) -> Mapping[str, Mapping[str, float]]:
    tensors = run.get("tensors")
    if not tensors:
        raise ValueError("run: no per-tensor statistics ('tensors'); evaluate it with this version")
    return dict(tensors)


def residual_max(run: Run, num_layers: int) -> float:
    """Max over the blocks ``0 … L−2`` of the block output's mean per-sample max |x| (the
    residual stream before the last block, where Bondarenko et al.'s outliers live)."""
    values = [
        stats["inf_norm"]
        for name, stats in _tensors(run).items()
        if (m := _BLOCK.fullmatch(name)) and int(m[1]) <= max(num_layers - 2, 0)
    ]
    if not values:
        raise ValueError("run: no block outputs among its tensors")
    return max(values)


def tensor_stats(run: Run, kind: str) -> tuple[float, float]:
    """``(average kurtosis, max inf norm)`` over the tensors of ``kind``: ``"all"``,
    ``"residual"`` (block outputs) or ``"attention"`` (attention output projections)."""
    matchers: dict[str, Callable[[str], bool]] = {
        "all": lambda name: True,
        "residual": lambda name: _BLOCK.fullmatch(name) is not None,
        "attention": lambda name: _ATTENTION_OUT.fullmatch(name) is not None,
    }
    if kind not in matchers:
        raise ValueError(f"kind must be one of {sorted(matchers)}, got {kind!r}")
    chosen = [s for name, s in _tensors(run).items() if matchers[kind](name)]
    kurtosis = [s["kurtosis"] for s in chosen if math.isfinite(s["kurtosis"])]
    if not kurtosis:
        raise ValueError(f"run: no finite statistics of {kind!r} tensors")
    return statistics.fmean(kurtosis), max(s["inf_norm"] for s in chosen)


# --------------------------------------------------------------------------------------------
# the validity gate


@dataclass(frozen=True)
class Gate:
    """The outcome of :func:`gate` for one arm.

    Attributes:
        passed: every condition holds.
        norm_ratios: vanilla residual max |x| / median RMS, per seed.
        gaps_pct: vanilla W8A8 cost in %, per seed.
        cuts: per seed, ``1 − gated / vanilla`` residual max |x|.
        seeds_cut: seeds in which the gated cut reaches the rule's ``gated_cut``.
        seeds_needed: how many must.
        reason: one line per condition.
    """

    passed: bool
    norm_ratios: list[float]
    gaps_pct: list[float]
    cuts: list[float]
    seeds_cut: int
    seeds_needed: int
    reason: str


def gate(
    vanilla: Sequence[Run], gated: Sequence[Run], num_layers: int, rule: GateRule = GATE
) -> Gate:
    """Whether an arm can test Softmax_1: its vanilla model forms residual outliers that cost
    W8A8 precision, and gated attention (the positive control) removes them.

    Conditions: median over seeds of vanilla's :func:`residual_max` / median RMS ``>=
    rule.norm_ratio``; median vanilla W8A8 cost ``>= rule.w8a8_gap_pct``; gated attention cuts
    :func:`residual_max` by ``>= rule.gated_cut`` in at least ``ceil(seed_fraction × seeds)``
    seeds (seed ``i`` of both lists is one pair).
    """
    if len(vanilla) != len(gated) or not vanilla:
        raise ValueError(
            f"vanilla and gated must pair up, got {len(vanilla)} and {len(gated)} runs"
        )
    ratios = [residual_max(r, num_layers) / r["median_scale"] for r in vanilla]
    gaps = [_gap_pct(r) for r in vanilla]
    cuts = [
        1 - residual_max(g, num_layers) / residual_max(v, num_layers)
        for v, g in zip(vanilla, gated, strict=True)
    ]
    needed = math.ceil(rule.seed_fraction * len(cuts) - 1e-9)
    ratio, gap = statistics.median(ratios), statistics.median(gaps)
    cut = sum(c >= rule.gated_cut for c in cuts)
    checks = [
        (
            ratio >= rule.norm_ratio,
            f"vanilla residual max|x| {ratio:.3g}× median RMS (>= {rule.norm_ratio:g}×)",
        ),
        (gap >= rule.w8a8_gap_pct, f"vanilla W8A8 cost {gap:.3g} % (>= {rule.w8a8_gap_pct:g} %)"),
        (
            cut >= needed,
            f"gated attention cuts it by >= {100 * rule.gated_cut:g} % in {cut} of "
            f"{len(cuts)} seeds (>= {needed})",
        ),
    ]
    reason = "; ".join(("ok: " if ok else "FAILS: ") + text for ok, text in checks)
    return Gate(all(ok for ok, _ in checks), ratios, gaps, cuts, cut, needed, reason)


# --------------------------------------------------------------------------------------------
# endpoints


@dataclass(frozen=True)
class Endpoint:
    """One quantity compared between paired runs.

    ``log = True``: the per-seed log-ratio (new / base) is tested and reported as a ratio;
    ``False``: the difference (new − base), in the quantity's unit.
    """

    name: str
    value: Callable[[Run, int], float]
    log: bool
    primary: bool = False


def _kind(kind: str, index: int) -> Callable[[Run, int], float]:
    return lambda run, layers: tensor_stats(run, kind)[index]


def _w8a8_extra_gap(run: Run, layers: int) -> float:
    if "w8a8_ppl_extra" not in run:
        return math.nan
    return 100 * (run["w8a8_ppl_extra"] - run["fp_ppl"]) / run["fp_ppl"]


#: The primary endpoint first, then the secondary ones.
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("residual max|x|, blocks 0…L−2", residual_max, log=True, primary=True),
    Endpoint("avg kurtosis, all tensors", _kind("all", 0), log=True),
    Endpoint("avg kurtosis, residual stream", _kind("residual", 0), log=True),
    Endpoint("avg kurtosis, attention outputs", _kind("attention", 0), log=True),
    Endpoint("max inf norm, all tensors", _kind("all", 1), log=True),
    Endpoint("max inf norm, attention outputs", _kind("attention", 1), log=True),
    Endpoint("W8A8 cost % (min–max)", lambda run, layers: _gap_pct(run), log=False),
    Endpoint("W8A8 cost % (percentile)", _w8a8_extra_gap, log=False),
)


@dataclass(frozen=True)
class Comparison:
    """An endpoint of a pair over seeds: the effect (mean log-ratio or mean difference), its
    95 % interval, the tests and the reading."""

    endpoint: Endpoint
    base: str
    new: str
    n: int
    effect: float
    interval: tuple[float, float]
    p_t: float
    p_wilcoxon: float | None
    seeds_lower: int
    reading: str

    def effect_text(self) -> str:
        low, high = self.interval
        if self.endpoint.log:
            return f"×{math.exp(self.effect):.3g} [{math.exp(low):.3g}, {math.exp(high):.3g}]"
        return f"{self.effect:+.3g} [{low:+.3g}, {high:+.3g}]"


def _reading(n: int, interval: tuple[float, float], log: bool) -> str:
    """``reduction`` (interval below 0), ``increase`` (above 0) or ``no significant change``,
    plus, for ratios, ``no paper-sized effect`` when the interval excludes a halving."""
    if n < MIN_RUNS:
        return f"inconclusive (fewer than {MIN_RUNS} seeds)"
    low, high = interval
    if math.isnan(low):
        return "inconclusive (no spread)"
    reading = "reduction" if high < 0 else "increase" if low > 0 else "no significant change"
    if log and low > math.log(PAPER_SIZED_RATIO):
        reading += "; no paper-sized effect"
    return reading


def compare_endpoint(
    endpoint: Endpoint,
    base: Sequence[Run],
    new: Sequence[Run],
    num_layers: int,
    names: tuple[str, str],
) -> Comparison | None:
    """``endpoint`` of ``new`` against ``base`` paired by seed (``None`` if not measured)."""
    a = [endpoint.value(r, num_layers) for r in base]
    b = [endpoint.value(r, num_layers) for r in new]
    if any(math.isnan(x) for x in a + b):
        return None
    if endpoint.log:
        a, b = [math.log(x) for x in a], [math.log(x) for x in b]
    paired = compare_paired(b, a, direction="lower")
    low, high = paired.interval
    interval = (-high, -low)  # the test signs differences towards the claim (new lower)
    return Comparison(
        endpoint,
        names[0],
        names[1],
        paired.n,
        -paired.mean_difference,
        interval,
        paired.p_t,
        paired.p_wilcoxon,
        sum(y < x for x, y in zip(a, b, strict=True)),
        _reading(paired.n, interval, endpoint.log),
    )


def endpoints(results: Mapping[str, Sequence[Run]], num_layers: int) -> list[Comparison]:
    """Every endpoint of every pair in :data:`PAIRS` whose variants were trained."""
    out = []
    for base, new in PAIRS:
        if base in results and new in results:
            for endpoint in ENDPOINTS:
                c = compare_endpoint(endpoint, results[base], results[new], num_layers, (base, new))
                if c is not None:
                    out.append(c)
    return out


# --------------------------------------------------------------------------------------------
# the experiment


_NOT_AN_ARM_FIELD = frozenset({"arms", "grid", "variants", "seeds", "workers", "threads"})


def arm_config(config: Config, overrides: Mapping[str, Any]) -> Config:
    """``config`` with an arm's overrides (every :class:`Config` field but the comparison's)."""
    if not isinstance(overrides, Mapping):
        raise TypeError(f"arms: each arm needs a mapping of overrides, got {overrides!r}")
    names = {f.name for f in fields(Config)} - _NOT_AN_ARM_FIELD
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(
            f"arms: {unknown} are not fields an arm may set; choose from {sorted(names)}"
        )
    return replace(config, arms={}, grid={}, **overrides)


#: The variants the decisive test compares (its control pair and Softmax_1).
REQUIRED_VARIANTS = ("softmax", "softmax1", "gated")
_CONTROL = ("softmax", "gated")


def run_arms(config: Config, ctx: RunContext) -> Results:
    """Run the decisive protocol over ``config.arms`` (see the module docstring)."""
    missing = [v for v in REQUIRED_VARIANTS if v not in config.variants]
    if missing:
        raise ValueError(
            f"variants: the decisive test needs {list(REQUIRED_VARIANTS)}, missing {missing}"
        )
    arms = {name: arm_config(config, overrides) for name, overrides in config.arms.items()}
    for arm in arms.values():
        _data(arm, ctx.data_dir)  # data errors before any training
    first = _CONTROL if config.gate_first else tuple(config.variants)
    stage = [(replace(a, variants=first), f"arms/{name}/") for name, a in arms.items()]
    trained = dict(zip(arms, compare_recipes(stage, ctx), strict=True))
    gates = {
        name: gate(r["softmax"], r["gated"], arms[name].num_layers, GATE)
        for name, r in trained.items()
    }
    rest = tuple(v for v in config.variants if v not in first)
    testable = [n for n in arms if rest and (gates[n].passed or not config.gate_first)]
    second = [(replace(arms[n], variants=rest), f"arms/{n}/") for n in testable]
    for name, runs in zip(testable, compare_recipes(second, ctx), strict=True):
        trained[name].update(runs)
    return _report(config, arms, trained, gates)


def _report(
    config: Config,
    arms: Mapping[str, Config],
    trained: Mapping[str, Mapping[str, list[dict[str, Any]]]],
    gates: Mapping[str, Gate],
) -> Results:
    results = Results(tables=[_arm_table(arms, gates), _gate_table(gates)])
    comparisons = {name: endpoints(trained[name], arms[name].num_layers) for name in arms}
    results.tables.append(_endpoint_table(comparisons, gates))
    for name, runs in trained.items():
        results.tables.extend(_compare_tables(runs, where=f"in arm {name}"))
    if config.ablation:
        results.tables.append(ablation_table(trained))
    for name in arms:
        results.notes.append(_conclusion(name, gates[name], comparisons[name]))
        results.metrics[f"{name}/gate_passed"] = float(gates[name].passed)
        primary = _primary(comparisons[name])
        if primary is not None:
            results.metrics[f"{name}/softmax1_residual_log_ratio"] = primary.effect
    return results


def _primary(comparisons: Sequence[Comparison]) -> Comparison | None:
    return next(
        (c for c in comparisons if c.endpoint.primary and (c.base, c.new) == PAIRS[0]), None
    )


def _conclusion(name: str, verdict: Gate, comparisons: Sequence[Comparison]) -> str:
    """The arm's outcome in one sentence (what the docs may say)."""
    if not verdict.passed:
        return f"Arm {name}: uninformative (the validity gate fails: {verdict.reason})."
    primary = _primary(comparisons)
    if primary is None:
        return f"Arm {name}: passes the gate, but Softmax_1 was not trained."
    return (
        f"Arm {name}: passes the gate; Softmax_1 changes the residual max|x| by "
        f"{primary.effect_text()} over {primary.n} seeds: {primary.reading}."
    )


def _arm_table(arms: Mapping[str, Config], gates: Mapping[str, Gate]) -> Table:
    rows = [
        [
            name,
            a.data + (f" (recall {a.recall_rate:g})" if a.data == "synthetic" else ""),
            a.lr,
            a.schedule + (f" to {a.min_lr_ratio:g}" if a.schedule != "constant" else ""),
            "yes" if a.ln_weight_decay else "no",
            a.steps,
            len(a.seeds),
            "passes" if gates[name].passed else "fails: uninformative",
        ]
        for name, a in arms.items()
    ]
    return Table(
        name="Decisive test: arms",
        columns=["arm", "data", "lr", "schedule", "LN-gain decay", "steps", "seeds", "gate"],
        rows=rows,
        caption="Every arm: pre-LN OPT-style model, AdamW with 5 % warm-up and weight decay 0.1; "
        "variants paired by training seed.",
    )


def _gate_table(gates: Mapping[str, Gate]) -> Table:
    def per_seed(values: Sequence[float], scale: float = 1.0) -> str:
        return ", ".join(f"{scale * v:.3g}" for v in values)

    rows = [
        [
            name,
            statistics.median(g.norm_ratios),
            per_seed(g.norm_ratios),
            statistics.median(g.gaps_pct),
            per_seed(g.gaps_pct),
            per_seed(g.cuts, 100),
            f"{g.seeds_cut}/{len(g.cuts)} (need {g.seeds_needed})",
            "passes" if g.passed else "fails",
        ]
        for name, g in gates.items()
    ]
    return Table(
        name="Validity gate",
        columns=[
            "arm",
            "vanilla max|x| / median RMS (median)",
            "per seed",
            "vanilla W8A8 cost % (median)",
            "per seed",
            "gated cut of max|x| %, per seed",
            "seeds cut ≥ 50 %",
            "gate",
        ],
        rows=rows,
        caption=f"max|x|: the residual stream (block outputs 0…L−2). The gate: median ratio ≥ "
        f"{GATE.norm_ratio:g}, median W8A8 cost ≥ {GATE.w8a8_gap_pct:g} %, and gated attention "
        f"cuts max|x| by ≥ {100 * GATE.gated_cut:g} % in ≥ 5/6 of the seeds.",
    )


def _endpoint_table(
    comparisons: Mapping[str, Sequence[Comparison]], gates: Mapping[str, Gate]
) -> Table:
    rows = []
    for name, items in comparisons.items():
        for c in items:
            rows.append(
                [
                    name if gates[name].passed else f"{name} (uninformative)",
                    f"{VARIANT_NAMES[c.base]} → {VARIANT_NAMES[c.new]}",
                    c.endpoint.name + (" (primary)" if c.endpoint.primary else ""),
                    c.n,
                    c.effect_text(),
                    c.p_t,
                    c.p_wilcoxon,
                    f"{c.seeds_lower}/{c.n}",
                    c.reading,
                ]
            )
    return Table(
        name="Endpoints (paired over training seeds)",
        columns=[
            "arm",
            "pair",
            "endpoint",
            "seeds",
            "effect [95 % CI]",
            "paired t p",
            "Wilcoxon p",
            "seeds lower",
            "reading",
        ],
        rows=rows,
        caption="Ratios: geometric mean of new / base over seeds (×1 = no change); W8A8 cost: "
        "mean difference in percentage points. 'reduction' only if the interval lies below "
        "no change; 'no paper-sized effect' if it excludes a halving. Wilcoxon from 6 seeds.",
    )


def ablation_table(trained: Mapping[str, Mapping[str, list[dict[str, Any]]]]) -> Table:
    """The quantizer ablation (:func:`hopfield.outliers.quantizer_ablation`) of every variant of
    every arm in ``trained`` (arm -> variant -> runs over seeds), as W8A8 cost % of the mean FP
    perplexity."""
    kinds: list[str] = []
    rows = []
    for name, runs in trained.items():
        for variant, seeds in runs.items():
            ablations = [r["ablation"] for r in seeds if "ablation" in r]
            if not ablations:
                continue
            kinds = kinds or list(ablations[0])
            fp = statistics.fmean(r["fp_ppl"] for r in seeds)
            rows.append(
                [name, VARIANT_NAMES[variant]]
                + [100 * (statistics.fmean(a[k] for a in ablations) / fp - 1) for k in kinds]
            )
    return Table(
        name="Quantizer ablation: W8A8 cost % with one kind of activation quantizer on",
        columns=["arm", "variant", *kinds],
        rows=rows,
        caption="Weights quantized throughout; mean perplexity over seeds against the mean FP "
        "perplexity.",
    )
