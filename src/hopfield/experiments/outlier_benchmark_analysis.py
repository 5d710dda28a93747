"""The protocol of ``outlier-benchmark``: its staged validity gate, the Softmax_1 comparisons, the
tables, the figures and the generated page ``docs/outlier-benchmark.md``.

The protocol is data, fixed before any run (``outlier_benchmark_protocol.json`` beside this
module; :func:`load_protocol` checks it). Per task and part (``sink``: the sink mass;
``outliers``: kurtosis, infinity norm and W8A8 cost):

* **stage 1** (:func:`stage1`): the vanilla arm's median over seeds reaches every threshold;
* **stage 2** (:func:`stage2`): at least one positive control *removes* the phenomenon: its
  paired one-sided t-test against vanilla gives ``p < alpha`` and its median falls below the
  stage-1 threshold;
* **stage 3** (:func:`stage3`): only then is Softmax_1 compared with vanilla, per claim metric,
  with :func:`hopfield.stats.compare_paired` (the ledger judges the same pairs from the
  record, :func:`hopfield.claims.extract.benchmark_pairs`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopfield.experiments.results import Results, RunContext, Table
from hopfield.stats import PairedComparison, compare_paired

__all__ = [
    "PROTOCOL_FILE",
    "TASK_TAGS",
    "Stage",
    "load_protocol",
    "render_doc",
    "report",
    "stage1",
    "stage2",
    "stage3",
]

PROTOCOL_FILE = Path(__file__).with_name("outlier_benchmark_protocol.json")

#: Short task names of the claim ids (``OEH-S2.1-sink-bench-bb``).
TASK_TAGS = {"bigram_backcopy": "bb", "wikitext": "lm"}

_METRICS = ("sink_mass", "residual_peak", "avg_kurtosis", "max_inf_norm", "w8a8_cost_pct")
Runs = Mapping[str, Mapping[str, Any]]


def load_protocol(path: Path | str = PROTOCOL_FILE) -> dict[str, Any]:
    """The protocol, checked: seeds, epsilon, alpha, and per part stage-1 thresholds, stage-2
    controls and claims on known metrics."""
    path = Path(path)
    try:
        protocol = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable protocol ({error})") from error
    problems = []
    if not isinstance(protocol.get("seeds_per_arm"), int) or protocol["seeds_per_arm"] < 6:
        problems.append("seeds_per_arm must be an int >= 6")
    if not 0 < protocol.get("alpha", 0) < 1:
        problems.append("alpha must lie in (0, 1)")
    parts = protocol.get("parts")
    if not isinstance(parts, dict) or set(parts) != {"sink", "outliers"}:
        problems.append("parts must be 'sink' and 'outliers'")
    else:
        for name, part in parts.items():
            metrics = [s.get("metric") for s in part.get("stage1", [])]
            metrics += [part.get("stage2", {}).get("metric")]
            metrics += [c.get("metric") for c in part.get("claims", [])]
            if (
                not part.get("stage1")
                or not part.get("claims")
                or any(m not in _METRICS for m in metrics)
            ):
                problems.append(
                    f"part {name}: stage1, stage2 and claims need metrics of {_METRICS}"
                )
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return protocol


def _values(runs: Runs, task: str, arm: str, metric: str) -> dict[int, float]:
    """``{seed: value}`` of ``arm``'s runs on ``task``."""
    return {
        int(r["seed"]): float(r[metric])
        for r in runs.values()
        if r["task"] == task and r["arm"] == arm
    }


def _paired(runs: Runs, task: str, new: str, base: str, metric: str) -> PairedComparison | None:
    """``new`` against ``base`` over their common seeds, claim direction ``lower``."""
    a, b = _values(runs, task, new, metric), _values(runs, task, base, metric)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return compare_paired([a[s] for s in seeds], [b[s] for s in seeds], direction="lower")


def _one_sided(result: PairedComparison) -> float:
    """One-sided p of a reduction from the comparison's two-sided decision p-value (the paired
    t-test, or the exact sign-flip test when the differences have no spread: six identical
    reductions give 1/64, never 0)."""
    if math.isnan(result.p_decision):
        return math.nan
    half = result.p_decision / 2
    return half if result.mean_difference > 0 else 1 - half


@dataclass(frozen=True)
class Stage:
    """One stage of the gate: passed, and one line per condition."""

    passed: bool
    lines: tuple[str, ...]


def stage1(runs: Runs, task: str, part: Mapping[str, Any], rival: str = "vanilla") -> Stage:
    """Vanilla's median over seeds reaches every stage-1 threshold of ``part``."""
    lines, ok = [], True
    for rule in part["stage1"]:
        values = list(_values(runs, task, rival, rule["metric"]).values())
        median = statistics.median(values) if values else math.nan
        hit = median >= rule["at_least"]
        ok &= hit
        lines.append(f"{rule['metric']} median {median:.3g} (need >= {rule['at_least']:g}): "
                     + ("ok" if hit else "fails"))  # fmt: skip
    return Stage(ok, tuple(lines))


def stage2(
    runs: Runs, task: str, part: Mapping[str, Any], alpha: float, rival: str = "vanilla"
) -> Stage:
    """At least one control removes the phenomenon (module docstring)."""
    rule = part["stage2"]
    metric = rule["metric"]
    threshold = next(r["at_least"] for r in part["stage1"] if r["metric"] == metric)
    lines, ok = [], False
    for control in rule["controls"]:
        result = _paired(runs, task, control, rival, metric)
        if result is None:
            lines.append(f"{control}: not trained")
            continue
        p = _one_sided(result)
        median = statistics.median(_values(runs, task, control, metric).values())
        removes = p < alpha and median < threshold
        ok |= removes
        lines.append(f"{control}: {metric} median {median:.3g}, paired one-sided p {p:.3g} "
                     f"(n={result.n}): " + ("removes it" if removes else "does not remove it"))  # fmt: skip
    return Stage(ok, tuple(lines))


def stage3(
    runs: Runs, task: str, part: Mapping[str, Any], rival: str = "vanilla"
) -> list[tuple[str, str, PairedComparison | None]]:
    """``(arm, metric, comparison)`` of every claim of ``part`` against ``rival``."""
    return [
        (c["arm"], c["metric"], _paired(runs, task, c["arm"], rival, c["metric"]))
        for c in part["claims"]
    ]


# --------------------------------------------------------------------------------------------
# tables and figures

_SUMMARY_COLUMNS = {
    "sink_mass": "sink mass",
    "sink_rate": "Sink^0.3 rate",
    "value_ratio": "value norm / median",
    "residual_peak": "residual peak",
    "avg_kurtosis": "avg kurtosis",
    "max_inf_norm": "max inf norm",
    "fp_ppl": "FP ppl",
    "w8a8_cost_pct": "W8A8 cost %",
    "train_loss": "final train loss",
}


def _median(runs: Runs, task: str, arm: str, metric: str) -> float | None:
    values = list(_values(runs, task, arm, metric).values())
    return statistics.median(values) if values else None


def arm_table(runs: Runs, task: str, arms: Sequence[str]) -> Table:
    """Medians over seeds of every summary per arm on ``task``."""
    rows = [
        [arm, len(_values(runs, task, arm, "sink_mass"))]
        + [_median(runs, task, arm, m) for m in _SUMMARY_COLUMNS]
        for arm in arms
    ]
    return Table(
        name=f"Arms on {task}: medians over seeds",
        columns=["arm", "seeds", *_SUMMARY_COLUMNS.values()],
        rows=rows,
        caption="Held-out batches. Sink mass: the strongest head's mean attention on the BOS "
        "token over the queries (Gu et al.'s ᾱ); Sink^0.3 rate: fraction of heads above 0.3; "
        "value norm / median: that head's BOS value-state norm over the median token's; residual "
        "peak: BOS residual RMS over the median token's, largest over the layers; kurtosis and "
        "inf norm over block outputs, attention output projections and FFN outputs; W8A8 cost: "
        "per-tensor fake quantization, % perplexity.",
    )


def quant_table(runs: Runs, task: str, arms: Sequence[str]) -> Table:
    """Median fake-quantization cost (% perplexity) per arm and scheme."""
    schemes: list[str] = []
    for r in runs.values():
        schemes = list(r["quant_cost_pct"])
        break
    rows = []
    for arm in arms:
        chosen = [r for r in runs.values() if r["task"] == task and r["arm"] == arm]
        medians: list[float | None] = [None] * len(schemes)
        if chosen:
            medians = [statistics.median(r["quant_cost_pct"][s] for r in chosen) for s in schemes]
        rows.append([arm, *medians])
    return Table(
        name=f"Fake quantization cost on {task}",
        columns=["arm", *schemes],
        rows=rows,
        caption="Median over seeds of 100·(quantized / FP perplexity − 1). tensor: one calibrated "
        "min–max range per activation tensor; token: a dynamic range per token. Weights "
        "symmetric per tensor; the LM head stays in floating point.",
    )


#: Readings of a paired comparison in the tables (verdict words belong to the ledger).
_READINGS = {
    "holds": "lower (CI above 0)",
    "does not hold": "higher (CI below 0)",
    "inconclusive": "no clear difference (CI spans 0 or too few seeds)",
}


def layer_table(runs: Runs, task: str, arms: Sequence[str]) -> Table:
    """Per layer and head: medians over seeds of the sink mass and the value-norm ratio, and per
    layer of the residual peak."""
    rows = []
    for arm in arms:
        chosen = [r["per_layer"] for r in runs.values() if r["task"] == task and r["arm"] == arm]
        if not chosen:
            continue
        for layer, heads in enumerate(chosen[0]["sink_mass"]):
            peak = statistics.median(c["residual_peak"][layer] for c in chosen)
            for head in range(len(heads)):
                rows.append([
                    arm, layer, head,
                    statistics.median(c["sink_mass"][layer][head] for c in chosen),
                    statistics.median(c["value_ratio"][layer][head] for c in chosen),
                    peak,
                ])  # fmt: skip
    return Table(
        name=f"Per layer and head on {task}",
        columns=["arm", "layer", "head", "sink mass", "value norm / median", "residual peak"],
        rows=rows,
        caption="Medians over seeds; the residual peak is the block output's (one per layer).",
    )


def _comparison_row(label: list[Any], result: PairedComparison | None) -> list[Any]:
    if result is None:
        return [*label, 0, None, None, None, "not trained"]
    low, high = result.interval
    return [*label, result.n, result.mean_difference, f"[{low:.3g}, {high:.3g}]", result.p_t,
            _READINGS[result.verdict]]  # fmt: skip


def report(
    tasks: Sequence[str],
    arms: Sequence[str],
    runs: Runs,
    protocol: Mapping[str, Any],
    ctx: RunContext | None,
) -> Results:
    """The experiment's tables, metrics, figures and notes."""
    results = Results()
    gate_rows, claim_rows, axis_rows = [], [], []
    for task in tasks:
        results.tables.append(arm_table(runs, task, arms))
        results.tables.append(quant_table(runs, task, arms))
        results.tables.append(layer_table(runs, task, arms))
        for name, part in protocol["parts"].items():
            first = stage1(runs, task, part, protocol["rival"])
            second = stage2(runs, task, part, protocol["alpha"], protocol["rival"])
            passed = first.passed and second.passed
            gate_rows.append([task, name, "; ".join(first.lines), "; ".join(second.lines),
                              "passes" if passed else "fails"])  # fmt: skip
            for stage, value in (("stage1", first.passed), ("stage2", second.passed),
                                 ("gate_passed", passed)):  # fmt: skip
                results.metrics[f"{task}/{name}/{stage}"] = float(value)
            for arm, metric, result in stage3(runs, task, part, protocol["rival"]):
                row = _comparison_row([task, name, f"{arm} vs vanilla", metric], result)
                if not passed:
                    row[-1] = f"not judged, the gate fails (measured: {row[-1]})"
                claim_rows.append(row)
            results.notes.append(_conclusion(task, name, first, second))
        for base, new in protocol["optimizer_axis"]:
            for metric in _METRICS:
                result = _paired(runs, task, new, base, metric)
                axis_rows.append(_comparison_row([task, f"{new} vs {base}", metric], result))
    results.tables.append(Table(
        name="Validity gate (stages 1 and 2)",
        columns=["task", "part", "stage 1: vanilla forms it", "stage 2: a control removes it",
                 "gate"],
        rows=gate_rows,
        caption="Thresholds and controls fixed before any run (outlier_benchmark_protocol.json).",
    ))  # fmt: skip
    comparison_columns = ["n", "mean (base − new)", "95 % CI", "paired t p", "reading"]
    results.tables.append(Table(
        name="Stage 3: Softmax_1 against vanilla",
        columns=["task", "part", "pair", "metric", *comparison_columns],
        rows=claim_rows,
        caption="Positive mean = Softmax_1 lower. Judged only where the gate passes; the ledger "
        "gives the verdicts (OEH-*-bench-*).",
    ))  # fmt: skip
    results.tables.append(Table(
        name="Optimizer axis (Kaul et al.)",
        columns=["task", "pair", "metric", *comparison_columns],
        rows=axis_rows,
        caption="AdamW against SGD for vanilla and Softmax_1, and Softmax_1 under SGD; positive "
        "mean = the second-named arm lower.",
    ))  # fmt: skip
    if ctx is not None:
        results.figures.extend(curve_figures(runs, tasks, arms, ctx))
    return results


def _conclusion(task: str, part: str, first: Stage, second: Stage) -> str:
    if not first.passed:
        return (f"{task}, {part}: the phenomenon did not form in vanilla (stage 1 fails: "
                f"{'; '.join(first.lines)}); Softmax_1 is not judged.")  # fmt: skip
    if not second.passed:
        return (f"{task}, {part}: it formed, but no positive control removed it (stage 2 fails: "
                f"{'; '.join(second.lines)}); Softmax_1 is not judged.")  # fmt: skip
    return f"{task}, {part}: the gate passes; Softmax_1 is judged (stage 3)."


def curve_figures(
    runs: Runs, tasks: Sequence[str], arms: Sequence[str], ctx: RunContext
) -> list[str]:
    """Per task, sink mass and residual peak over training, mean over seeds per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for task in tasks:
        figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for arm in arms:
            curves = [r["curve"] for r in runs.values() if r["task"] == task and r["arm"] == arm]
            curves = [c for c in curves if c]
            if not curves:
                continue
            steps = [p["step"] for p in curves[0]]
            for axis, key in zip(axes, ("sink_mass", "residual_peak"), strict=True):
                mean = [statistics.fmean(c[i][key] for c in curves if i < len(c))
                        for i in range(len(steps))]  # fmt: skip
                axis.plot(steps, mean, label=arm)
        for axis, label in zip(axes, ("sink mass (strongest head)", "residual peak (max layer)"),
                               strict=True):  # fmt: skip
            axis.set_xlabel("step")
            axis.set_ylabel(label)
        axes[1].set_yscale("log")
        if axes[0].lines:
            axes[0].legend(fontsize=7)
        figure.suptitle(f"{task}: mean over seeds on a held-out batch")
        figure.tight_layout()
        names.append(ctx.save_figure(figure, f"curves_{task}.png"))
    return names


# --------------------------------------------------------------------------------------------
# the generated page


def render_doc(results_dir: Path | str, protocol: Mapping[str, Any] | None = None) -> str:
    """``docs/outlier-benchmark.md`` from the record in ``results_dir/outlier-benchmark`` (and
    the ledger's ``claims.json`` there), or, without a record, the protocol and "not run yet"."""
    protocol = protocol or load_protocol()
    folder = Path(results_dir) / "outlier-benchmark"
    lines = [_DOC_HEAD.strip(), "", "## Protocol (fixed before any run)", ""]
    lines += _protocol_lines(protocol)
    record_file = folder / "results.json"
    if not record_file.is_file():
        lines += ["", "## Results", "", "No recorded run yet. Run the CPU preset with:", "",
                  "```", _COMMAND, "```"]  # fmt: skip
        return "\n".join(lines) + "\n"
    record = json.loads(record_file.read_text())
    results = Results.from_dict(record["results"])
    runs = json.loads((folder / "runs.json").read_text())
    verdicts = _ledger(Path(results_dir))
    trained = runs.get("runs", {}).values()
    tasks = ", ".join(record["config"].get("tasks", []))
    lines += ["", "## Results", "",
              f"Preset `{record['preset']}` (tasks: {tasks}; overrides: "
              f"{record.get('overrides') or 'none'}), code commit "
              f"`{runs.get('code_commit', 'unknown')}`, {len(trained)} runs, "
              f"{sum(r.get('train_seconds', 0.0) for r in trained) / 3600:.2f} h of training "
              f"summed over the runs (each process's wall time), the record's sitting "
              f"{record['wall_time_s']:.0f} s on {record.get('processes', 1)} process(es).",
              ""]  # fmt: skip
    lines += _verdict_lines(record, verdicts)
    lines += _next_steps(record["results"]["metrics"])
    for name in results.figures:
        lines += ["", f"![{name}](../results/outlier-benchmark/{name})"]
    for table in results.tables:
        lines += ["", f"### {table.name}", "", table.body_markdown()]
    lines += ["", "## Notes", ""] + [f"- {note}" for note in results.notes]
    return "\n".join(lines) + "\n"


_COMMAND = ("OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m hopfield.cli run "
            "outlier-benchmark --preset small --out runs --data-dir ../shared/data")  # fmt: skip

_DOC_HEAD = """
# outlier-benchmark: attention sinks that form, fixes that remove them, and Softmax_1

<!-- This page is generated by `python -m hopfield.experiments.outlier_benchmark_analysis
RESULTS_DIR docs/outlier-benchmark.md` from the record; edit the generator, not the page. -->

OutEffHop's central claim (Softmax_1 removes the attention outliers that break 8-bit
quantization, Table 1) needs a setting where those outliers form. The `decisive` preset of
`outlier-formation` formed none, so it could not test the claim. This benchmark takes the
settings where the literature finds the phenomenon cheaply:

- **Bigram-Backcopy** (Guo et al. 2024, arXiv 2410.13835): a BOS token, then a fixed Markov
  chain over 63 tokens, except that after one of 3 trigger tokens the next token copies the token
  before the trigger. 1–3-layer, 1-head transformers form an attention sink on BOS, a value-state
  drain and a residual-state peak; ReLU attention and SGD remove them.
- **A language model with a fixed BOS token** at position 0 of every packed WikiText-2 block
  (Gu et al., ICLR 2025: a fixed first token gives the strongest sink).

The synthetic delimiter streams of `outlier-formation` are left out: there, gating raised the
attention-output kurtosis 8–13× and no sink formed, so they cannot serve as a positive-control
setting.

Arms: vanilla softmax; Softmax_1; gated attention and clipped softmax (Bondarenko et al. 2023);
a learnable per-head sink logit (minimal); ReLU attention and SGD (Guo et al.'s positive
controls); an explicit key/value attention bias (Sun et al. 2024, *Massive Activations*); and
vanilla and Softmax_1 under SGD, so that attention and optimiser causes can be told apart
(Kaul et al., ICLR 2025: softmax-1 alone removed first-token dominance, but kurtosis and the 4-bit
penalty fell only when Adam was replaced).

Measurements (held-out batches, `hopfield.outliers.sinks`): the sink mass of every layer and head
(Gu et al.'s mean attention on the BOS key over the queries) and the Sink^0.3 rate; the BOS
value-state norm over the median token's; the residual peak (BOS residual RMS over the median
token's); average kurtosis and maximum infinity norm as `hopfield.outliers` defines them (block
outputs, attention output projections, FFN outputs); fake-quantization cost at W8A8, W6A6 and
W4A8 with per-tensor and per-token activations (`quantize_w8a8`; the attention probabilities of
this model are not quantized).

## Sizing of the CPU preset (a pilot, not a result)

One vanilla seed per task at the `small` settings (1,500 steps, batch 64, T = 32, d = 64, two
layers, one head, AdamW 1e-3), 27 Nov, not recorded and not read by any verdict: Bigram-Backcopy
took 48 CPU-seconds and ended with a sink mass of 0.73 in layer 2 (value norm 0.15 × the median,
residual peak 1.6, W8A8 cost 0.006 %); the fixed-BOS LM (vocabulary 1,024) took 86
CPU-seconds with a sink mass of 0.15 (residual peak 2.0, W8A8 cost 0.18 %; 0.13 with a
vocabulary of 2,048). ReLU attention on Bigram-Backcopy (1,000 steps) ended at 0.02, SGD (lr 0.1,
momentum 0.9) at 0.63. At 3e-4 (Guo et al.'s rate) the sink mass was 0.55 after 1,000 steps at
T = 64 and still rising, hence 1e-3 on the CPU. The 108 runs (9 arms × 6 seeds × 2 tasks) come
to about 7,200 CPU-seconds: 1.3–2 h under `torchrun --nproc_per_node 2` on an otherwise idle
2-core machine. If the pilot is a guide, the sink part can pass its gate on Bigram-Backcopy, and
the outlier part (residual peak ≥ 5, W8A8 cost ≥ 1 %) and the LM's sink part will not at this
scale.
"""


def _protocol_lines(protocol: Mapping[str, Any]) -> list[str]:
    lines = [f"Version {protocol['version']}, fixed {protocol['fixed']}. "
             f"{protocol['seeds_per_arm']} paired seeds per arm; α = {protocol['alpha']}; "
             f"Sink^ε with ε = {protocol['sink_epsilon']}.", ""]  # fmt: skip
    for name, part in protocol["parts"].items():
        lines.append(f"- **{name}**: {part['question']}.")
        for rule in part["stage1"]:
            lines.append(f"  - stage 1: vanilla `{rule['metric']}` ≥ {rule['at_least']:g} "
                         f"({rule['why']}).")  # fmt: skip
        controls = ", ".join(f"`{c}`" for c in part["stage2"]["controls"])
        lines.append(f"  - stage 2 on `{part['stage2']['metric']}`, controls {controls}: "
                     f"{part['stage2']['rule']}.")  # fmt: skip
        claims = ", ".join(f"`{c['metric']}` {c['direction']}" for c in part["claims"])
        lines.append(f"  - stage 3: Softmax_1 against vanilla: {claims}.")
    lines += [""] + [f"- {rule}" for rule in protocol["rules"]]
    return lines


def _ledger(results_dir: Path) -> dict[str, str]:
    path = results_dir / "claims.json"
    if not path.is_file():
        return {}
    return {r["id"]: r["verdict"] for r in json.loads(path.read_text())}


def _verdict_lines(record: Mapping[str, Any], verdicts: Mapping[str, str]) -> list[str]:
    """One line per task and part: the gate, and the claims' ledger verdicts."""
    metrics = record["results"]["metrics"]
    lines = []
    for task, tag in TASK_TAGS.items():
        for part, ids in (("sink", ["OEH-S2.1-sink-bench"]),
                          ("outliers", ["OEH-T1-kurtosis-bench", "OEH-T1-infnorm-bench",
                                        "OEH-T1-w8a8-bench"])):  # fmt: skip
            key = f"{task}/{part}/gate_passed"
            if key not in metrics:
                continue
            tags = ", ".join(
                f"[ledger: {i}-{tag} → {verdicts[f'{i}-{tag}']}]"
                for i in ids
                if f"{i}-{tag}" in verdicts
            )
            gate = "passes" if metrics[key] >= 1 else "fails"
            lines.append(f"- {task}, {part}: the validity gate {gate}. {tags}".rstrip())
    return lines


#: What a failed stage suggests doing next (part, stage) -> sentence.
_NEXT = {
    ("sink", 1): "vanilla formed no sink: train on more tokens (Gu et al. find no sink below "
    "roughly 50–100 M unique tokens in their LM) — the `gpu` preset, Guo et al.'s full "
    "Bigram-Backcopy recipe — before changing the attention.",
    ("sink", 2): "a sink formed but no control removed it: check the controls' training (their "
    "final loss in the arm table) before reading anything into Softmax_1.",
    ("outliers", 1): "the sink formed without massive activations or a W8A8 cost: the residual "
    "peak needs longer Adam training (Guo et al.'s peak grows after the sink); the `gpu` preset "
    "trains 512 sequences a step.",
    ("outliers", 2): "the outliers formed but no control removed them: compare the SGD arms "
    "(Kaul et al.: the optimiser drives outliers) in the optimizer-axis table.",
}


def _next_steps(metrics: Mapping[str, float]) -> list[str]:
    """For every task and part whose gate fails, the next step its failing stage suggests."""
    lines = []
    for task in TASK_TAGS:
        for part in ("sink", "outliers"):
            if metrics.get(f"{task}/{part}/gate_passed", 1.0) >= 1:
                continue
            stage = 1 if metrics.get(f"{task}/{part}/stage1", 0.0) < 1 else 2
            lines.append(f"- Next step for {task}, {part} (stage {stage} fails): "
                         f"{_NEXT[(part, stage)]}")  # fmt: skip
    return ["", "### What the data suggest next", "", *lines] if lines else []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hopfield.experiments.outlier_benchmark_analysis RESULTS_DIR OUT.md``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m hopfield.experiments.outlier_benchmark_analysis RESULTS_DIR "
              "OUT.md", file=sys.stderr)  # fmt: skip
        return 2
    Path(args[1]).write_text(render_doc(args[0]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
