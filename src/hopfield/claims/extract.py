"""Extractors: how each experiment family's record gives the evidence for a claim.

Each function here returns an :data:`~hopfield.claims.claim.Extractor` (a function of an
:class:`~hopfield.claims.records.ExperimentRecord`) configured for one claim. Empirical
extractors pair ours and the rival over independent runs (training seeds, memory sets, datasets
and horizons); they raise :class:`~hopfield.claims.claim.NotTested` when the record holds no such
runs (a model the preset leaves out, no outliers formed, a toy stand-in).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from hopfield.claims.claim import Claim, Comparison, Evidence, Extractor, Measured, NotTested
from hopfield.claims.records import RESULTS_FILE, ExperimentRecord
from hopfield.claims.verdict import PREMISE_ABSENT, TOY_STAND_IN
from hopfield.models.stanhop import figure_layer
from hopfield.outliers import DEAD_ROW_SUM
from hopfield.outliers.metrics import COMPONENTS
from hopfield.stats import fit_slope, linear_slope, split_replicate_key

__all__ = [
    "benchmark_pairs",
    "combine",
    "convergence_speed",
    "cost_memory",
    "cost_time",
    "efficiency_flops",
    "efficiency_time",
    "formation_variants",
    "hyperset_accuracy",
    "hyperset_params",
    "hyperset_trajectory",
    "mil_auc",
    "mil_bags",
    "mil_curves",
    "outlier_component",
    "outlier_curves",
    "outlier_depth",
    "outlier_params",
    "outlier_reduction",
    "outlier_variants",
    "retrieval",
    "retrieval_drop",
    "stanhop",
    "stanhop_curves",
    "theory_check",
    "theory_claim",
    "timeseries",
]

Samples = dict[str, float]
"""Values keyed by the independent run (unit) they come from."""


def pair(rival: str, ours: Samples, others: Samples, model: str = "") -> Comparison:
    """The comparison of ``ours`` (of ``model``) with ``others`` over the units both have."""
    units = [u for u in ours if u in others]
    return Comparison(
        rival, tuple(ours[u] for u in units), tuple(others[u] for u in units), tuple(units), model
    )


def _require_real_runs(record: ExperimentRecord) -> None:
    """Smoke runs (``--max-steps``, ``--stand-in-data``) test no empirical claim."""
    if record.smoke_run is not None:
        raise NotTested(record.smoke_run)


def combine(*extractors: Extractor) -> Extractor:
    """One extractor giving the comparisons of all of ``extractors`` (empirical claims)."""

    def extract(record: ExperimentRecord) -> Evidence:
        out: list[Comparison] = []
        for extractor in extractors:
            evidence = extractor(record)
            if isinstance(evidence, Measured):
                raise TypeError("combine joins empirical evidence only")
            out += evidence
        return out

    return extract


def _require_paper_preset(record: ExperimentRecord) -> None:
    """Parameter counts are the paper's only at the paper preset (smoke runs count)."""
    if record.preset != "paper":
        raise NotTested(
            f"parameter counts are the paper's only at the paper preset, not {record.preset}"
        )


def empirical(read: Callable[[ExperimentRecord], list[Comparison]]) -> Extractor:
    """``read`` behind the smoke-run check, dropping comparisons without pairs (a model the
    preset leaves out)."""

    def extract(record: ExperimentRecord) -> Evidence:
        _require_real_runs(record)
        comparisons = [c for c in read(record) if c.ours]
        if not comparisons:
            raise NotTested(f"{record.name} at {record.preset} has none of the runs compared")
        return comparisons

    return extract


# ----------------------------------------------------------------------------------- theory


def theory_claim(
    paper: str, id: str, location: str, statement: str, source: str, check: str
) -> Claim:
    """A claim the ``theory`` experiment checks in its row ``(source, check…)``
    (:func:`theory_check`): exact, it holds when the row counts no violation."""
    return Claim(
        id, paper, location, statement, 0, "violations", "equal", "exact", "theory",
        theory_check(source, check),
    )  # fmt: skip


def theory_check(source: str, statement: str) -> Extractor:
    """The violation count of the ``theory`` experiment's check ``(source, statement…)``; an
    ``info`` row is reported for reference and never decides a claim."""

    def extract(record: ExperimentRecord) -> Evidence:
        columns, rows = record.table("Theory checks")
        col = {c: i for i, c in enumerate(columns)}
        for row in rows:
            if row[col["paper"]] == source and str(row[col["statement"]]).startswith(statement):
                if row[col["kind"]] == "info":
                    raise NotTested(f"theory's row {source}: {statement} is an info row")
                trials, violations = row[col["trials"]], row[col["violations"]]
                return Measured(float(violations), f"{violations} violations in {trials} trials")
        raise NotTested(f"theory at {record.preset} has no check {source}: {statement}")

    return extract


# ------------------------------------------------------------------- memory retrieval studies

_RETRIEVAL_FILES = {
    "memory-capacity": ("capacity_checkpoint.json", "size"),
    "noise-robustness": ("noise_checkpoint.json", "sigma"),
}


def _retrieval_points(record: ExperimentRecord) -> list[dict[str, Any]]:
    if record.name not in _RETRIEVAL_FILES:
        raise ValueError(f"{record.name} is no retrieval study")
    cases = record.side(_RETRIEVAL_FILES[record.name][0]).get("cases", {})
    return [p for case in cases.values() for p in case["points"]]


def _retrieval_samples(
    points: list[dict[str, Any]], model: str, *, study: str, criterion: str, steps: int, level: Any
) -> Samples:
    """Per (dataset, memory set) success of ``model`` at ``level`` (size or σ)."""
    samples: Samples = {}
    for p in points:
        same = p["model"] == model and p["study"] == study and p["steps"] == steps
        if same and level in (p.get("size"), p.get("sigma")):
            for i, v in enumerate(p["values"][criterion]):
                unit = f"{p['dataset']}/{p['query']} set {i}"
                if unit in samples:
                    raise ValueError(f"two {model} points for {unit} at {level}")
                samples[unit] = float(v)
    return samples


def _levels(record: ExperimentRecord, points: list[dict[str, Any]]) -> list[Any]:
    key = _RETRIEVAL_FILES[record.name][1]
    return sorted({p[key] for p in points})


def _study_points(
    record: ExperimentRecord, study: str, datasets: Sequence[str]
) -> tuple[list[dict[str, Any]], int]:
    """The points of ``study`` on ``datasets`` (all when empty) and their largest step count."""
    points = [
        p
        for p in _retrieval_points(record)
        if p["study"] == study and (not datasets or p["dataset"] in datasets)
    ]
    if not points:
        raise NotTested(f"{record.name} at {record.preset} has no {study} points on {datasets}")
    if len({p.get("beta") for p in points}) > 1:
        # a study run at several β (OutEffHop's sweep): its claims are read at the run's β
        beta = record.config.get("beta")
        points = [p for p in points if p.get("beta") == beta]
        if not points:
            raise ValueError(f"{record.name}: no {study} points at the run's beta {beta}")
    return points, max(p["steps"] for p in points)


def retrieval(
    models: Sequence[str],
    rivals: Sequence[str],
    *,
    study: str,
    criterion: str,
    steps: str = "max",
    datasets: Sequence[str] = (),
) -> Extractor:
    """Each model against each rival at the largest memory size (``memory-capacity``) or noise
    level (``noise-robustness``).

    Pairs: (dataset, query, memory set). ``steps`` is ``"max"`` (the most update steps run) or
    ``"one"``.
    """

    def read(record: ExperimentRecord) -> list[Comparison]:
        points, most = _study_points(record, study, datasets)
        n_steps = most if steps == "max" else 1
        top = _levels(record, points)[-1]

        def at(model: str) -> Samples:
            return _retrieval_samples(
                points, model, study=study, criterion=criterion, steps=n_steps, level=top
            )

        return [pair(r, at(m), at(r), m) for m in models for r in rivals]

    return empirical(read)


def retrieval_drop(models: Sequence[str], against: str, *, study: str, criterion: str) -> Extractor:
    """Each model's loss of success from the smallest to the largest memory size / noise level
    against the loss of ``against``, paired over (dataset, query, memory set) with the most
    update steps run."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        points, most = _study_points(record, study, ())
        levels = _levels(record, points)

        def drop(model: str) -> Samples:
            first, last = (
                _retrieval_samples(
                    points, model, study=study, criterion=criterion, steps=most, level=level
                )
                for level in (levels[0], levels[-1])
            )
            return {u: first[u] - last[u] for u in first if u in last}

        return [pair(f"{against}'s drop", drop(m), drop(against), m) for m in models]

    return empirical(read)


# ------------------------------------------------------------------------------ convergence


def convergence_speed(model: str, rivals: Sequence[str]) -> Extractor:
    """Mean test accuracy over the epochs (area under the curve) of ``model`` against each rival,
    paired over (dataset, training seed) from ``convergence/curves.json``."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        curves = record.side("curves.json")

        def auc(name: str) -> Samples:
            return {
                f"{dataset} seed {i}": statistics.fmean(run["test_accuracy"])
                for dataset, models in curves.items()
                for i, run in enumerate(models.get(name, []))
                if run.get("test_accuracy")
            }

        return [pair(r, auc(model), auc(r), model) for r in rivals]

    return empirical(read)


# ---------------------------------------------------------------------------- outlier study

#: Table 1's max inf norm per model family (:data:`hopfield.experiments.outliers.TABLE_INF_NORM`).
_INF_NORM = {"bert": "max_ffn_out_inf_norm", "opt": "max_inf_norm", "vit": "max_inf_norm"}

#: The outliers experiment's own test of whether outliers formed: vanilla W8A8 costs at least
#: 1 % of its FP metric, or its average kurtosis is at least 10.
_FORMED_GAP_PCT, _FORMED_KURTOSIS = 1.0, 10.0


def _outlier_runs(record: ExperimentRecord, family: str, variant: str) -> dict[str, dict]:
    """The runs of ``variant`` the record aggregated, by seed: none of a variant its config
    leaves out, even where the folder holds its runs (a campaign commits each run as it lands,
    and a record's verdicts must not move until the record itself is made again)."""
    named = record.config.get("variants")
    if named is not None and variant not in named:
        return {}
    runs = {}
    for path in record.files(f"runs/{family}/{variant}/seed-*/result.json"):
        run = record.side(str(path.relative_to(record.folder)))
        runs[f"seed {run['seed']}"] = run
    return runs


def _outlier_value(family: str, metric: str, run: dict[str, Any]) -> float:
    """One run's ``metric``: avg_kurtosis, max_inf_norm (Table 1's), fp, w8a8_degradation (W8A8
    minus FP, signed so that larger is worse), special_mass, row_sum (means over modules)."""
    if metric == "avg_kurtosis":
        return float(run["summary"]["avg_kurtosis"])
    if metric == "max_inf_norm":
        return float(run["summary"][_INF_NORM[family]])
    fp = statistics.fmean(run["fp"])
    if metric == "fp":
        return fp
    if metric == "w8a8_degradation":
        change = statistics.fmean(run["w8a8"]) - fp
        return -change if family == "vit" else change  # ViT: accuracy, higher is better
    if metric in ("special_mass", "row_sum"):
        return statistics.fmean(a[metric] for a in run["attention"].values())
    raise ValueError(f"unknown outlier metric {metric!r}")


def _require_outliers(family: str, vanilla: dict[str, dict]) -> None:
    """:class:`NotTested` unless vanilla attention formed outliers (the experiment's test)."""
    if not vanilla:
        raise NotTested(f"no vanilla {family} runs")
    gaps = [
        100 * _outlier_value(family, "w8a8_degradation", r) / abs(_outlier_value(family, "fp", r))
        for r in vanilla.values()
        if _outlier_value(family, "fp", r) != 0
    ] or [0.0]
    kurtosis = [_outlier_value(family, "avg_kurtosis", r) for r in vanilla.values()]
    if statistics.fmean(gaps) < _FORMED_GAP_PCT and statistics.fmean(kurtosis) < _FORMED_KURTOSIS:
        raise NotTested(
            f"no outliers formed in vanilla {family} (W8A8 costs {statistics.fmean(gaps):.2g} %, "
            f"avg kurtosis {statistics.fmean(kurtosis):.3g})",
            PREMISE_ABSENT,
        )


def _require_live_attention(family: str, runs: dict[str, dict[str, dict]]) -> None:
    """:class:`NotTested` (premise absent) when one of the variants ``runs`` holds (variant ->
    its runs by seed) has attention that carries no weight: the mean row sum of its attention
    weights, in the runs that recorded them, below :data:`~hopfield.outliers.DEAD_ROW_SUM`."""
    for variant, found in runs.items():
        sums = [_outlier_value(family, "row_sum", r) for r in found.values() if r.get("attention")]
        mean = statistics.fmean(sums) if sums else math.inf
        if mean < DEAD_ROW_SUM:
            raise NotTested(
                f"{variant} attention carries no weight in {family}: its weights sum to "
                f"{mean:.2g} a row (mean of {len(sums)} runs; every weight "
                "clipped to 0), so the comparison is not about attention",
                PREMISE_ABSENT,
            )


def outlier_variants(
    family: str, pairs: Sequence[tuple[str, str, str]], *, needs_outliers: bool = True
) -> Extractor:
    """``(variant, rival variant, metric)`` comparisons of the ``outliers`` study of ``family``,
    paired over training seeds; with ``needs_outliers``, only where vanilla formed outliers;
    only between variants whose attention carries weight (:func:`_require_live_attention`)."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        if needs_outliers:
            _require_outliers(family, _outlier_runs(record, family, "softmax"))
        out = []
        for new, old, metric in pairs:
            ours, rival = _outlier_runs(record, family, new), _outlier_runs(record, family, old)
            _require_live_attention(family, {new: ours, old: rival})
            out.append(
                pair(
                    f"{old} ({metric})",
                    {u: _outlier_value(family, metric, r) for u, r in ours.items()},
                    {u: _outlier_value(family, metric, r) for u, r in rival.items()},
                    new,
                )
            )
        return out

    return empirical(read)


def outlier_params(family: str, variant: str) -> Extractor:
    """The parameter count of ``family``/``variant`` in a ``paper``-preset outliers record."""

    def extract(record: ExperimentRecord) -> Evidence:
        _require_paper_preset(record)
        return Measured(record.metric(f"{family}/{variant}/parameters"))

    return extract


#: Table 1's (softmax-based, Softmax_1-based) variant pairs and STanHop-Net's names for them.
_TABLE1_PAIRS = (
    ("softmax", "softmax1"),
    ("clipped", "clipped_softmax1"),
    ("gated", "gated_softmax1"),
)
_STANHOP_NAMES = {"softmax": "dense", "softmax1": "outeffhop", "clipped": "clipped",
                  "clipped_softmax1": "clipped_outeffhop", "gated": "gated",
                  "gated_softmax1": "gated_outeffhop"}  # fmt: skip


def _sibling(record: ExperimentRecord, name: str) -> ExperimentRecord | None:
    """The record of experiment ``name`` in the same results folder as ``record``, if any."""
    folder = record.folder.parent / name
    return ExperimentRecord.load(folder) if (folder / RESULTS_FILE).is_file() else None


def _study_reductions(record: ExperimentRecord, family: str, metric: str) -> list[Samples]:
    """Per pair of Table 1, the per-seed reductions ``100·(1 − new/old)`` of ``metric`` of
    ``family`` from the ``outliers`` study (the record ``outliers`` or ``outliers-<family>`` of the
    folder holding all six variants); :class:`NotTested` without them or without outliers."""
    reasons = []
    for name in ("outliers", f"outliers-{family}"):
        study = _sibling(record, name)
        if study is None:
            continue
        runs = {v: _outlier_runs(study, family, v) for p in _TABLE1_PAIRS for v in p}
        missing = [variant for variant, found in runs.items() if not found]
        if missing:
            reasons.append(f"{name} has no {family} runs of {', '.join(missing)}")
            continue
        _require_outliers(family, runs["softmax"])
        _require_live_attention(family, runs)
        return [
            {
                unit: 100 * (1 - _outlier_value(family, metric, runs[new][unit])
                             / _outlier_value(family, metric, runs[old][unit]))
                for unit in runs[old] if unit in runs[new]
            }
            for old, new in _TABLE1_PAIRS
        ]  # fmt: skip
    raise NotTested("; ".join(reasons) or f"no outliers or outliers-{family} results")


def _stanhop_reductions(record: ExperimentRecord, metric: str) -> list[Samples]:
    """Table 1's STanHop-Net pairs (ETTh1, horizon 24) from ``stanhop-outliers``, per seed."""
    study = _sibling(record, "stanhop-outliers")
    if study is None:
        raise NotTested("no stanhop-outliers results in this folder")
    runs = study.side("runs.json")

    def seeds(variant: str) -> Samples:
        samples = _stanhop_samples(
            runs, _STANHOP_NAMES[variant], lambda r: float(r[metric]), [("ETTh1", 24)]
        )
        return {f"seed {unit.rsplit(' ', 1)[1]}": v for unit, v in samples.items()}

    out = []
    for old, new in _TABLE1_PAIRS:
        before, after = seeds(old), seeds(new)
        if not before or not after:
            raise NotTested(f"stanhop-outliers has no ETTh1/24 runs of {old} and {new}")
        out.append({u: 100 * (1 - after[u] / before[u]) for u in before if u in after})
    return out


def outlier_reduction(metric: str) -> Extractor:
    """The abstract's average reduction of ``metric`` (``avg_kurtosis`` or ``max_inf_norm``, Table
    1's) over Table 1's 12 (model, pair) comparisons: per training seed, the mean over BERT, OPT
    and ViT (the ``outliers`` study: ``outliers`` or ``outliers-<model>`` in the folder) and
    STanHop-Net (``stanhop-outliers`` at ETTh1/24) of ``100·(1 − new/old)`` for Vanilla →
    OutEffHop, Clipped Softmax → Clipped OutEffHop, Gated Attention → Gated OutEffHop, against no
    reduction (0). Whatever record the ledger passes, the four models are read from the folder
    holding it. :class:`NotTested` names every model lacking its six variants and every
    transformer whose vanilla runs formed no outliers (as the Table 1 claims require)."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        per_pair: list[Samples] = []
        untested: list[NotTested] = []
        for family in ("bert", "opt", "vit"):
            try:
                per_pair += _study_reductions(record, family, metric)
            except NotTested as why:
                untested.append(why)
        try:
            per_pair += _stanhop_reductions(record, metric)
        except NotTested as why:
            untested.append(why)
        if untested:
            kinds = {why.kind for why in untested}
            kind = PREMISE_ABSENT if PREMISE_ABSENT in kinds else untested[0].kind
            raise NotTested("; ".join(map(str, untested)), kind)
        units = [u for u in per_pair[0] if all(u in p for p in per_pair)]
        means = {u: statistics.fmean(p[u] for p in per_pair) for u in units}
        model = f"mean over Table 1's {len(per_pair)} pairs"
        return [pair("no reduction", means, dict.fromkeys(units, 0.0), model)]

    return empirical(read)


def _component_column(family: str, label: str) -> str:
    """The per-layer tables' column of the component ``label`` (``"FFN 2"``, ``"attention LN"``;
    :data:`~hopfield.outliers.metrics.COMPONENTS`)."""
    return COMPONENTS[family][label].lstrip(".") or "block"


def _layer_values(run: dict[str, Any], key: str, component: str) -> dict[int, float]:
    """``{layer: mean inf norm}`` of ``component`` from a run's per-layer table ``key``
    (``layer_inf_norms``: Table 1's tensors; ``component_inf_norms``: every layer component)."""
    if key not in run:
        raise NotTested(f"the runs were recorded before {key} was kept")
    columns, rows = run[key]["columns"], run[key]["rows"]
    if component not in columns:
        raise NotTested(f"the runs' {key} has no {component}")
    column = columns.index(component)
    return {int(r[0]): float(r[column]) for r in rows if r[0] != "-" and r[column] is not None}


def _figure_layers(layers: int) -> tuple[int, int]:
    """The shallowest and deepest of Figure 3's layers (3, 6, 9, 10 of 12, scaled to ``layers``,
    as :mod:`hopfield.experiments.outliers` draws them)."""
    chosen = [max(0, min(layers - 1, round(layers * k / 12))) for k in (3, 10)]
    if chosen[0] == chosen[1]:
        raise NotTested(f"{layers} layer(s): no depth to compare")
    return chosen[0], chosen[1]


def _vanilla_and_outeffhop(record: ExperimentRecord, family: str) -> tuple[dict, dict]:
    """The vanilla and OutEffHop runs of ``family``, where vanilla formed outliers."""
    vanilla, outeffhop = (_outlier_runs(record, family, v) for v in ("softmax", "softmax1"))
    _require_outliers(family, vanilla)
    return vanilla, outeffhop


def outlier_depth(family: str) -> Extractor:
    """Figure 3: the FFN output's mean inf norm per layer (``layer_inf_norms`` of each run, at
    evaluation) between the shallowest and deepest of the figure's layers, paired over seeds, in
    two comparisons: vanilla's value at the shallow layer against its value at the deep one (it
    grows with depth), and OutEffHop's growth ``log(deep / shallow)`` against vanilla's (it stays
    more consistent across layers). For a claim of direction ``lower``."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        component = _component_column(family, "FFN 2")
        vanilla, outeffhop = _vanilla_and_outeffhop(record, family)
        by_layer = {
            variant: {u: _layer_values(r, "layer_inf_norms", component) for u, r in runs.items()}
            for variant, runs in (("softmax", vanilla), ("softmax1", outeffhop))
        }
        first = next(iter(by_layer["softmax"].values()), {})
        shallow, deep = _figure_layers(len(first))

        def at(variant: str, layer: int) -> Samples:
            return {u: values[layer] for u, values in by_layer[variant].items()}

        def growth(variant: str) -> Samples:
            return {u: math.log(v[deep] / v[shallow]) for u, v in by_layer[variant].items()}

        return [
            pair(f"softmax layer {deep}", at("softmax", shallow), at("softmax", deep),
                 f"softmax layer {shallow}"),
            pair(f"softmax (growth log(layer {deep} / layer {shallow}))", growth("softmax1"),
                 growth("softmax"), "softmax1"),
        ]  # fmt: skip

    return empirical(read)


def outlier_component(family: str, component: str) -> Extractor:
    """Figure 4: OutEffHop against vanilla on the mean inf norm of ``component`` (a
    :data:`~hopfield.outliers.metrics.COMPONENTS` label) in the figure's layer
    ``L − 2`` (``component_inf_norms`` of each run, at evaluation), paired over seeds."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        column = _component_column(family, component)
        vanilla, outeffhop = _vanilla_and_outeffhop(record, family)

        def at_figure_layer(runs: dict[str, dict]) -> Samples:
            out = {}
            for unit, run in runs.items():
                values = _layer_values(run, "component_inf_norms", column)
                out[unit] = values[max(0, len(values) - 2)]
            return out

        return [pair("softmax", at_figure_layer(outeffhop), at_figure_layer(vanilla), "softmax1")]

    return empirical(read)


#: The layer index in a module name (``bert.encoder.layer.3.output``, ``vit.layers.3.mlp``).
_LAYER_INDEX = re.compile(r"\.layers?\.(\d+)(?=\.|$)")


def _module_layer(name: str) -> int | None:
    match = _LAYER_INDEX.search(name)
    return int(match[1]) if match else None


def _figure2_curve_mean(curve: Sequence[Any], layers: int | None = None) -> float | None:
    """Figure 2's read-out of one run's training curve (``[(step, {module: max |x|})]``): the
    mean over the logged steps of the largest ``max |x|`` among the modules of layer ``L - 2``
    (``layers`` = L; ``None``: the curve logs every layer and L is read from it). ``None`` for
    a run without a curve (recorded before curves were kept)."""
    if not curve:
        return None
    if layers is None:
        found = [_module_layer(n) for _, modules in curve for n in modules]
        layers = 1 + max((j for j in found if j is not None), default=0)
    layer = max(0, layers - 2)
    peaks = [
        max(float(v) for n, v in modules.items() if _module_layer(n) == layer)
        for _, modules in curve
        if any(_module_layer(n) == layer for n in modules)
    ]
    return statistics.fmean(peaks) if peaks else None


def _study_layers(run: dict[str, Any]) -> int | None:
    """The layer count of an ``outliers`` study run (``None`` for an ``outlier-formation`` run,
    whose curve logs every layer)."""
    identity = run.get("identity")
    return int(identity["settings"]["layers"]) if identity else None


def outlier_curves(family: str, pairs: Sequence[tuple[str, str]]) -> Extractor:
    """Figure 2(a-c): per pair ``(counterpart, OutEffHop variant)``, the variant against its
    counterpart on the mean over a run's training curve of ``max |x|`` at layer ``L - 2`` (the
    paper's layer 10 of 12), paired over training seeds, where vanilla attention formed
    outliers. Reads the ``outliers`` study's runs (``curve`` in each ``result.json``) or, for
    OPT, ``outlier-formation``'s (``curve`` in ``compare.json``, every arm that passes its
    validity gate). Runs without a curve are left out."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        if record.name == "outlier-formation":
            arms = _formation_runs(record, needs_outliers=True)

            def runs_of(variant: str) -> dict[str, dict[str, Any]]:
                return _formation_variant_runs(arms, variant)

        else:
            _require_outliers(family, _outlier_runs(record, family, "softmax"))

            def runs_of(variant: str) -> dict[str, dict[str, Any]]:
                return _outlier_runs(record, family, variant)

        def samples(variant: str) -> Samples:
            means = {
                unit: _figure2_curve_mean(run.get("curve", ()), _study_layers(run))
                for unit, run in runs_of(variant).items()
            }
            return {unit: mean for unit, mean in means.items() if mean is not None}

        return [pair(old, samples(new), samples(old), new) for old, new in pairs]

    return empirical(read)


def _formation_runs(record: ExperimentRecord, needs_outliers: bool) -> dict[str, dict[str, Any]]:
    """``{unit prefix: compare.json runs}`` of an ``outlier-formation`` record: the comparison
    under the search's recipe (prefix ``""``), or, for the decisive test (``arms`` in its
    config), the runs of every arm, and with ``needs_outliers`` only of the arms that pass the
    validity gate (``<arm>/gate_passed``; an arm failing it is uninformative)."""
    arms = list(record.config.get("arms") or {})
    if not arms:
        if needs_outliers and record.metric("recipe_found") < 1:
            raise NotTested(
                "the outlier-formation search found no recipe (no outliers formed)", PREMISE_ABSENT
            )
        return {"": record.side("compare.json")["runs"]}
    if needs_outliers:
        arms = [arm for arm in arms if record.metric(f"{arm}/gate_passed") >= 1]
        if not arms:
            raise NotTested(
                "every arm of the decisive outlier test fails its validity gate (uninformative)",
                PREMISE_ABSENT,
            )
    return {arm: record.side(f"arms/{arm}/compare.json")["runs"] for arm in arms}


def _formation_variant_runs(
    arms: dict[str, dict[str, Any]], variant: str
) -> dict[str, dict[str, Any]]:
    """The runs of ``variant`` in :func:`_formation_runs`' arms, keyed by unit (``"seed N"``,
    or ``"<arm> seed N"`` in the decisive test)."""
    return {
        f"{unit} seed {key.split('/seed')[1]}".lstrip(): run
        for unit, runs in arms.items()
        for key, run in runs.items()
        if key.split("/seed")[0] == variant
    }


def formation_variants(
    pairs: Sequence[tuple[str, str, str]], *, needs_outliers: bool = True
) -> Extractor:
    """``(variant, rival variant, metric)`` comparisons of ``outlier-formation``'s variants under
    its recipe, paired over training seeds (``compare.json``), or over the arms × seeds of the
    decisive test; with ``needs_outliers``, only when vanilla attention forms outliers (the
    search found a recipe; the arm passes its validity gate). Metrics: the run fields, plus
    ``w8a8_gap_pct`` (100·(W8A8 − FP)/FP perplexity)."""

    def value(run: dict[str, Any], metric: str) -> float:
        if metric == "w8a8_gap_pct":
            return 100 * (run["w8a8_ppl"] - run["fp_ppl"]) / run["fp_ppl"]
        return float(run[metric])

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _formation_runs(record, needs_outliers)

        def samples(variant: str, metric: str) -> Samples:
            return {u: value(r, metric) for u, r in _formation_variant_runs(runs, variant).items()}

        return [
            pair(f"{old} ({m})", samples(new, m), samples(old, m), new) for new, old, m in pairs
        ]

    return empirical(read)


def benchmark_pairs(
    task: str, part: str, metric: str, *, arm: str = "softmax1", rival: str = "vanilla"
) -> Extractor:
    """``arm`` against ``rival`` on ``metric`` over the paired seeds of ``outlier-benchmark``'s
    ``task`` (``runs.json``), only where the record's staged validity gate for ``part``
    (``"sink"`` or ``"outliers"``) passes (``<task>/<part>/gate_passed``); otherwise the premise
    is absent and the claim is not tested: stage 1 (vanilla formed no sink or outliers) or stage
    2 (no positive control removed them) failed. A run of fewer seeds than the protocol fixes
    (``runs.json``'s ``protocol``) tests nothing."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        prefix = f"{task}/{part}"
        if record.metric(f"{prefix}/gate_passed") < 1:
            if record.metric(f"{prefix}/stage1") < 1:
                why = f"premise absent: vanilla formed no {part} phenomenon on {task} (stage 1)"
            else:
                why = f"no positive control removed the {part} phenomenon on {task} (stage 2)"
            raise NotTested(f"the validity gate of outlier-benchmark fails: {why}", PREMISE_ABSENT)
        stored = record.side("runs.json")
        fixed = int(stored["protocol"]["seeds_per_arm"])
        if int(record.config.get("seeds", 0)) < fixed:
            raise NotTested(
                f"outlier-benchmark ran {record.config.get('seeds')} seeds per arm, fewer than "
                f"the {fixed} its protocol fixes"
            )
        runs = stored["runs"]

        def samples(name: str) -> Samples:
            return {
                f"{task} seed {r['seed']}": float(r[metric])
                for r in runs.values()
                if r["task"] == task and r["arm"] == name
            }

        return [pair(rival, samples(arm), samples(rival), arm)]

    return empirical(read)


# ------------------------------------------------------------------------------- STanHop-Net


def _stanhop_samples(
    runs: dict[str, Any],
    name: str,
    value: Callable[[dict[str, Any]], float],
    settings: Sequence[tuple[str, int]] = (),
) -> Samples:
    """``value`` of each finished ``stanhop-outliers`` run of model ``name`` on the real
    datasets (restricted to ``settings`` if given), keyed ``"<dataset>/<horizon> seed <s>"``."""
    out = {}
    for key, run in runs.items():
        dataset, horizon, which, seed = key.split("|")
        chosen = not settings or (dataset, int(horizon)) in settings
        if which == name and dataset != "synthetic" and chosen and run.get("finished", True):
            out[f"{dataset}/{horizon} seed {seed}"] = value(run)
    return out


def stanhop(
    model: str, rivals: Sequence[str], metric: str, *, settings: Sequence[tuple[str, int]] = ()
) -> Extractor:
    """``model`` against each rival on ``metric`` (a field of ``stanhop-outliers/runs.json``:
    mse, avg_kurtosis, max_inf_norm, w8a8_mse, or ``w8a8_degradation`` = W8A8 − FP MSE), paired
    over (dataset, horizon, seed) on the real datasets, restricted to ``settings`` if given."""

    def value(run: dict[str, Any]) -> float:
        if metric == "w8a8_degradation":
            return float(run["w8a8_mse"]) - float(run["mse"])
        return float(run[metric])

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = record.side("runs.json")
        ours = _stanhop_samples(runs, model, value, settings)
        if not ours:
            wanted = ", ".join(f"{d}/{h}" for d, h in settings) or "the real datasets"
            raise NotTested(f"stanhop-outliers at {record.preset} has no {model} runs on {wanted}")
        return [pair(r, ours, _stanhop_samples(runs, r, value, settings), model) for r in rivals]

    return empirical(read)


def stanhop_curves(pairs: Sequence[tuple[str, str]]) -> Extractor:
    """Figure 2(d): per pair ``(counterpart, OutEffHop variant)`` of ``stanhop-outliers``
    models, the variant against its counterpart on the mean over a run's training curve of
    ``max |x|`` at the figure's decoder layer
    (:func:`~hopfield.models.stanhop.figure_layer` of the record's ``e_layers``),
    paired over (dataset, horizon, seed) on the real datasets. Runs without a curve (recorded
    before curves were kept) are left out."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        if "e_layers" not in record.config:
            raise NotTested(f"stanhop-outliers at {record.preset} records no e_layers")
        layer = f"decoder.{figure_layer(int(record.config['e_layers']))}"
        runs = {key: run for key, run in record.side("runs.json").items() if run.get("curve")}

        def curve_mean(run: dict[str, Any]) -> float:
            return statistics.fmean(float(point["max_abs"][layer]) for point in run["curve"])

        def samples(name: str) -> Samples:
            return _stanhop_samples(runs, name, curve_mean)

        return [pair(old, samples(new), samples(old), new) for old, new in pairs]

    return empirical(read)


def stanhop_params(model: str) -> Extractor:
    """STanHop-Net's parameter count without the position tables (the paper's count) at the
    paper preset."""

    def extract(record: ExperimentRecord) -> Evidence:
        _require_paper_preset(record)
        runs = record.side("runs.json")
        counts = {
            r["params_without_position_tables"] for k, r in runs.items() if k.split("|")[2] == model
        }
        if not counts:
            raise NotTested(f"no {model} run in stanhop-outliers")
        return Measured(float(min(counts)))

    return extract


# ------------------------------------------------------------------------- outlier cost


def _cost_rounds(record: ExperimentRecord, family: str) -> list[dict[str, Any]]:
    """The timing rounds of ``family`` in ``outlier-cost/measurements.json``."""
    rounds = record.side("measurements.json")["families"].get(family, {}).get("rounds")
    if not rounds:
        raise NotTested(f"outlier-cost at {record.preset} measured no {family}")
    return list(rounds)


def cost_time(family: str) -> Extractor:
    """Table 4's time: OutEffHop's log training-step throughput ``−ln(seconds per step)``
    against vanilla's, paired over the timing rounds of ``outlier-cost`` (the replicates: each
    round times both variants, in alternating order), on the record's clock (``config.clock``:
    process CPU or wall time)."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        clock = str(record.config.get("clock", "cpu"))
        rounds = _cost_rounds(record, family)

        def throughput(variant: str) -> Samples:
            return {f"round {i}": -math.log(float(r[variant][clock])) for i, r in enumerate(rounds)}

        return [pair(f"vanilla (ln steps/s, {clock} clock)", throughput("softmax1"),
                     throughput("softmax"), "OutEffHop")]  # fmt: skip

    return empirical(read)


def cost_memory(family: str) -> Extractor:
    """Table 4's memory: the largest ``|100·(OutEffHop/vanilla − 1)|`` (%) over the rounds of
    ``outlier-cost`` of a training step's peak memory. Exact: the bytes a step allocates are
    the same in every round (the rounds repeat one count; they are no independent replicates),
    so the claim is a bound on that count's relative difference."""

    def extract(record: ExperimentRecord) -> Evidence:
        changes = [
            100.0 * (float(r["softmax1"]["peak_bytes"]) / float(r["softmax"]["peak_bytes"]) - 1)
            for r in _cost_rounds(record, family)
        ]
        worst = max(changes, key=abs)
        detail = (
            f"OutEffHop/vanilla peak memory of a step {min(changes):+.3g} % to "
            f"{max(changes):+.3g} % over {len(changes)} rounds"
        )
        return Measured(abs(worst), detail)

    return extract


# ---------------------------------------------------------------------------- time series


def timeseries(models: Sequence[str], rivals: Sequence[str], metric: str) -> Extractor:
    """Each model against each rival in ``timeseries-hopfield`` on ``metric`` (``mse``: test
    MSE, ``cpu_seconds_per_epoch``), paired over (dataset, horizon, seed)."""

    def value(run: dict[str, Any]) -> float:
        return float(run["test"]["mse"] if metric == "mse" else run[metric])

    def samples(runs: dict[str, Any], name: str) -> Samples:
        out = {}
        for key, run in runs.items():
            dataset, horizon, which, seed = key.split("|")
            if which == name and run.get("finished", True):
                out[f"{dataset}/{horizon} seed {seed}"] = value(run)
        return out

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = record.side("runs.json")
        return [pair(r, samples(runs, m), samples(runs, r), m) for m in models for r in rivals]

    return empirical(read)


# ------------------------------------------------------------------------------------- MIL


def _mil_runs(record: ExperimentRecord) -> dict[str, dict[str, Any]]:
    return dict(record.side("runs.json").get("runs", {}))


def mil_bags(
    models: Sequence[str], rival: str, *, against_smallest: bool = False, prefix: bool = False
) -> Extractor:
    """Test accuracy at the largest bag size of ``mil-mnist-bags``, paired over seeds: each
    model against ``rival`` or (``against_smallest``) against itself at the smallest bag size.
    With ``prefix``, every method whose name starts with a model's name takes part."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _mil_runs(record)
        sizes = sorted({int(k.split("/")[0]) for k in runs})
        methods = sorted({k.split("/")[1] for k in runs})
        chosen = [m for m in methods if any(m == x or (prefix and m.startswith(x)) for x in models)]

        def acc(method: str, size: int) -> Samples:
            return {
                f"seed {k.split('/')[2]}": float(r["test_accuracy"])
                for k, r in runs.items()
                if k.split("/")[:2] == [str(size), method]
            }

        if not sizes:
            return []
        big = sizes[-1]
        if against_smallest:
            return [pair(f"bags of {sizes[0]}", acc(m, big), acc(m, sizes[0]), m) for m in chosen]
        return [pair(rival, acc(m, big), acc(rival, big), m) for m in chosen if m != rival]

    return empirical(read)


def mil_curves(models: Sequence[str], rival: str) -> Extractor:
    """Mean test accuracy over the epochs at ``curve_bag_size`` (Figure 4's curves) of every
    method starting with a name in ``models`` against ``rival``, paired over seeds."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _mil_runs(record)

        def auc(method: str) -> Samples:
            return {
                f"bags of {k.split('/')[0]} seed {k.split('/')[2]}": statistics.fmean(
                    r["curves"]["test_accuracy"]
                )
                for k, r in runs.items()
                if k.split("/")[1] == method and r.get("curves", {}).get("test_accuracy")
            }

        methods = sorted({k.split("/")[1] for k in runs})
        chosen = [m for m in methods if any(m.startswith(x) for x in models) and m != rival]
        return [pair(rival, auc(m), auc(rival), m) for m in chosen]

    return empirical(read)


def mil_auc(model: str, rival: str, *, exclude: Sequence[str] = ()) -> Extractor:
    """Fold-mean test ROC-AUC of ``mil-benchmark``, ``model`` against ``rival``: one comparison
    per dataset (a stratum, ``rival on DATASET``), paired over the training seeds (the
    replicates; the folds of one seed are not independent), leaving out the datasets in
    ``exclude``. The claim holds where it holds on every dataset."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _mil_runs(record)

        def auc(method: str) -> dict[str, Samples]:
            folds: dict[tuple[str, str], list[float]] = {}
            for key, r in runs.items():
                dataset, which, seed, _fold = key.split("/")
                if which == method and dataset not in exclude:
                    folds.setdefault((dataset, f"seed {seed}"), []).append(float(r["test_auc"]))
            out: dict[str, Samples] = {}
            for (dataset, seed), values in folds.items():
                out.setdefault(dataset, {})[seed] = statistics.fmean(values)
            return out

        ours, others = auc(model), auc(rival)
        return [
            pair(f"{rival} on {dataset}", ours[dataset], others[dataset], model)
            for dataset in ours
            if dataset in others
        ]

    return empirical(read)


# ------------------------------------------------------------------------------- efficiency


def efficiency_time(models: Sequence[str], rival: str, *, mode: str = "layer") -> Extractor:
    """Forward CPU time of each model against ``rival`` (``efficiency/measurements.json``) at
    every ``(d, L)`` of the larger half of the memory sizes, where the papers' asymptotic claims
    apply: one comparison per model and point, of the log times of its repeated timings (the
    replicates, ``cpu_samples``; a record of medians only gives one each, too few to decide).
    ``rival`` ``"lowest probability"`` compares a random-mask model with the random-mask model
    of the lowest masked share."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        points = record.side("measurements.json")["points"]
        times: dict[str, dict[str, Samples]] = {}
        for key, p in points.items():
            p_mode, d, model, size = key.split("|")
            if p_mode == mode and not p.get("skipped"):
                samples = p.get("cpu_samples") or [p["cpu_seconds"]]
                times.setdefault(model, {})[f"d={d} L={size}"] = {
                    f"repeat {i}": math.log(float(t)) for i, t in enumerate(samples)
                }
        sizes = sorted({int(u.split("L=")[1]) for s in times.values() for u in s})
        upper = set(sizes[len(sizes) // 2 :])

        def compare(model: str, other: str) -> list[Comparison]:
            mine, theirs = times.get(model, {}), times.get(other, {})
            return [
                pair(f"{other} at {point} (log CPU s)", mine[point], theirs[point], model)
                for point in mine
                if point in theirs and int(point.split("L=")[1]) in upper
            ]

        if rival == "lowest probability":
            randoms = sorted((m for m in times if m.startswith("random-")), key=_probability)
            return [c for m in randoms[1:] for c in compare(m, randoms[0])]
        chosen = [m for m in sorted(times) if any(m.startswith(x) for x in models)]
        return [c for m in chosen if m != rival for c in compare(m, rival)]

    return empirical(read)


def efficiency_slopes(models: Sequence[str], rival: str, *, mode: str = "layer") -> Extractor:
    """The growth of forward CPU time with the number of memories: per ``d`` and model, the
    least-squares slope of log time on log ``L`` over the larger half of the memory sizes (the
    points the model and ``rival`` both ran), one slope per repeated timing (the replicates:
    repeat ``i`` of every point), against ``rival``'s slopes (dense: quadratic, about 2)."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        points = record.side("measurements.json")["points"]
        series: dict[tuple[str, str], dict[int, list[float]]] = {}
        for key, p in points.items():
            p_mode, d, model, size = key.split("|")
            if p_mode == mode and not p.get("skipped"):
                samples = p.get("cpu_samples") or [p["cpu_seconds"]]
                series.setdefault((d, model), {})[int(size)] = [float(t) for t in samples]
        sizes = sorted({size for runs in series.values() for size in runs})
        upper = set(sizes[len(sizes) // 2 :])

        def slopes(runs: dict[int, list[float]], kept: list[int]) -> Samples:
            repeats = min(len(runs[size]) for size in kept)
            found = {
                f"repeat {i}": fit_slope(kept, [runs[s][i] for s in kept]) for i in range(repeats)
            }
            return {unit: slope for unit, slope in found.items() if slope is not None}

        found = []
        for (d, model), runs in sorted(series.items()):
            other = series.get((d, rival))
            if model == rival or other is None or not model.startswith(tuple(models)):
                continue
            kept = sorted(upper & runs.keys() & other.keys())
            if len(kept) >= 3:
                found.append(pair(f"{rival} at d={d} (slope of log CPU s in log L)",
                                  slopes(runs, kept), slopes(other, kept), model))  # fmt: skip
        return found

    return empirical(read)


def _probability(model: str) -> float:
    return float(model.split("-", 1)[1])


#: Fig. 7's words as exact relations between FLOP counts: "far fewer" is at most a tenth of
#: dense's at the largest memory size; "share FLOPs" is within 10 % of each other at every size
#: (a gap of 10 % is 0.04 decades, lines that overlap on the figure's log axis; 1.5× would
#: show as two lines).
FAR_FEWER, SHARED = 0.1, 0.1


def efficiency_flops(
    efficient: Sequence[str], shared: Sequence[tuple[str, str]], *, mode: str = "layer"
) -> Extractor:
    """Figure 7 from the ``Matrix-product FLOPs`` table of an ``efficiency`` record (mode
    ``layer``: the Hopfield layer the paper measured), at every ``d`` of the record: the
    matrix products, which the paper's fvcore counted (the ``Analytic FLOPs`` table, every
    operation, is extra information; a record without the matrix-product table tests nothing).

    The counts are exact: :func:`~hopfield.experiments.efficiency.analytic_flops` evaluates each
    algorithm's operation count at each ``(d, L)``, so they carry no noise and no seeds, and the
    claim is judged as an exact one (``kind="exact"``): the measured value is the number of the
    figure's relations the counts break, and the claim holds when it is 0. The relations, per
    ``d``: every model starting with a name in ``efficient`` needs at most :data:`FAR_FEWER` of
    dense's FLOPs at the largest ``L`` (the figure's "far fewer"); every ``(a, b)`` of ``shared``
    has counts within :data:`SHARED` of each other at every ``L`` ("the lines overlap"). The
    detail gives the ratios.
    """

    def extract(record: ExperimentRecord) -> Evidence:
        columns, rows = record.table("Matrix-product FLOPs")
        counts: dict[tuple[int, str], list[float]] = {
            (int(r[1]), str(r[2])): [float(v) for v in r[3:] if v is not None]
            for r in rows
            if r[0] == mode
        }
        if not counts:
            raise NotTested(f"efficiency at {record.preset} counts no FLOPs in mode {mode}")
        relations: list[bool] = []  # True where the counts break the relation
        notes = []
        for d in sorted({key[0] for key in counts}):
            dense = counts[(d, "dense")]
            fewer = [
                values[-1] / dense[-1]
                for (dim, model), values in counts.items()
                if dim == d and model.startswith(tuple(efficient))
            ]
            relations += [share > FAR_FEWER for share in fewer]
            notes.append(f"d={d}: efficient / dense at {columns[-1]} <= {max(fewer):.3g}")
            for a, b in shared:
                ratios = [x / y for x, y in zip(counts[(d, a)], counts[(d, b)], strict=True)]
                relations.append(max(abs(r - 1) for r in ratios) > SHARED)
                notes.append(f"{a} / {b} {min(ratios):.3g}-{max(ratios):.3g}")
        broken = sum(relations)
        detail = f"{broken} of {len(relations)} relations fail ({'; '.join(notes)})"
        return Measured(float(broken), detail)

    return extract


# -------------------------------------------------------------------------------- Hyper-SET


def _hyperset_runs(record: ExperimentRecord) -> dict[str, dict[str, Any]]:
    runs = record.side("runs.json")
    return {k: v for k, v in runs.items() if isinstance(v, dict) and v.get("finished", True)}


def _replicates(runs: dict[str, Any], model: str) -> dict[str, dict[str, Any]]:
    """The runs of ``model`` keyed ``"run <r>"`` by replicate (keys of :func:`replicate_key`)."""
    found = {}
    for key, run in runs.items():
        name, replicate = split_replicate_key(key)
        if name == model:
            found[f"run {replicate}"] = run
    return found


def hyperset_accuracy(pairs: Sequence[tuple[str, str]], *, at: str = "L") -> Extractor:
    """Accuracy of Hyper-SET runs, ``(model, rival model)`` pairs from ``runs.json`` of
    ``hyperset-images`` (top-1) or ``hyperset-sudoku`` (board accuracy after ``at`` = ``"L"``
    iterations, or ``"2L"``; a rival named ``"<model>@L"`` is the same model after L).
    The replicates of a model (``hyperset-images``' ``seeds``) pair with the rival's of the same
    seed; a record with one run per model gives one pair."""

    def value(runs: dict[str, Any], name: str, iterations: int) -> Samples:
        model, _, when = name.partition("@")
        steps = iterations * (2 if (when or at) == "2L" else 1)
        samples: Samples = {}
        for unit, run in _replicates(runs, model).items():
            if "board" not in run:
                samples[unit] = float(run["accuracy"])
            elif len(run["board"]) >= steps:
                samples[unit] = float(run["board"][steps - 1])
        return samples

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _hyperset_runs(record)
        iterations = int(record.config.get("iterations", 1))
        return [
            pair(
                rival.replace("@L", " after L iterations"),
                value(runs, model, iterations),
                value(runs, rival, iterations),
                model,
            )
            for model, rival in pairs
        ]

    return empirical(read)


def hyperset_extrapolation_gain(model: str, rival: str) -> Extractor:
    """``hyperset-sudoku``: the gain in board accuracy from L to 2L test iterations of ``model``
    against ``rival``'s, paired by replicate (seed)."""

    def gains(runs: dict[str, Any], name: str, iterations: int) -> Samples:
        return {
            unit: float(run["board"][2 * iterations - 1] - run["board"][iterations - 1])
            for unit, run in _replicates(runs, name).items()
            if len(run.get("board", ())) >= 2 * iterations
        }

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _hyperset_runs(record)
        iterations = int(record.config.get("iterations", 1))
        ours, theirs = gains(runs, model, iterations), gains(runs, rival, iterations)
        return [pair(rival, ours, theirs, model)]

    return empirical(read)


def hyperset_subspace_change(models: Sequence[str], quantities: Sequence[str]) -> Extractor:
    """Change from ``X_0`` to ``X_L`` of each subspace statistic in ``quantities`` (``erank``,
    ``angle``: means over heads) of each model of ``hyperset-images``' App. F.3 contrast,
    against 0, one unit per replicate (from the trajectories in ``runs.json``)."""

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _hyperset_runs(record)
        comparisons = []
        for model in models:
            tracks = {
                unit: run["subspaces"]
                for unit, run in _replicates(runs, model).items()
                if run.get("subspaces")
            }
            for quantity in quantities:
                change = {u: float(t[-1][quantity] - t[0][quantity]) for u, t in tracks.items()}
                key = f"contrast_{model}_{quantity}_change"
                comparisons.append(pair("0", change, dict.fromkeys(change, 0.0), key))
        return comparisons

    return empirical(read)


def _trajectory_slope(rows: Sequence[dict[str, Any]], quantity: str) -> float:
    return linear_slope([float(row[quantity]) for row in rows])


def _trajectory_change(rows: Sequence[dict[str, Any]], quantity: str) -> float:
    return float(rows[-1][quantity] - rows[0][quantity])


_TRAJECTORY_READOUTS = {"slope": _trajectory_slope, "change": _trajectory_change}


def hyperset_trajectory(model: str, readouts: Sequence[tuple[str, str]]) -> Extractor:
    """Read-outs of ``model``'s Figs. 5-6 trajectory (``analysis`` in ``runs.json``: one row
    after each iteration t = 1, 2, ...) over its ``L`` training iterations, against 0, one unit
    per replicate (the rows past L, test-time extrapolation, are left out).

    ``readouts`` are ``(quantity, how)`` pairs: ``how`` is ``"slope"`` (least-squares slope of
    the quantity, e.g. ``e_attn``, against t) or ``"change"`` (its value after iteration L less
    its value after iteration 1, e.g. ``erank``); the comparison is named ``<quantity>_<how>``.
    """
    unknown = sorted({how for _, how in readouts} - set(_TRAJECTORY_READOUTS))
    if unknown:
        raise ValueError(f"readouts: unknown read-outs {unknown}, expected slope or change")

    def read(record: ExperimentRecord) -> list[Comparison]:
        runs = _hyperset_runs(record)
        iterations = int(record.config.get("iterations", 1))
        tracks = {
            unit: run["analysis"][:iterations]
            for unit, run in _replicates(runs, model).items()
            if run.get("analysis")
        }
        comparisons = []
        for quantity, how in readouts:
            values = {u: _TRAJECTORY_READOUTS[how](rows, quantity) for u, rows in tracks.items()}
            comparisons.append(pair("0", values, dict.fromkeys(values, 0.0), f"{quantity}_{how}"))
        return comparisons

    return empirical(read)


def hyperset_params(model: str, *, base: str = "") -> Extractor:
    """The parameter count of a Hyper-SET experiment's ``model`` at the paper preset, less that
    of ``base`` if given (an increment)."""

    def count(runs: dict[str, Any], name: str) -> float:
        if name not in runs:
            raise NotTested(f"hyperset run at paper has no {name} run")
        return float(runs[name]["params"])

    def extract(record: ExperimentRecord) -> Evidence:
        _require_paper_preset(record)
        runs = record.side("runs.json")
        return Measured(count(runs, model) - (count(runs, base) if base else 0.0))

    return extract


def hyperset_toy(record: ExperimentRecord) -> Evidence:
    """The masked-image-modelling claims need ImageNet-100 and the MaskGIT tokenizer; the
    experiment's runs are a toy stand-in and test none of them."""
    raise NotTested(
        f"{record.name} is a toy stand-in (digits, k-means codes), not ImageNet-100", TOY_STAND_IN
    )
