"""The claims ledger: claims as data, verdicts from synthetic records, ``hopfield claims`` and
``hopfield reproduce`` on real tiny runs."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hopfield.claims import VERDICTS, Claim, Comparison, Measured, judge
from hopfield.claims.ledger import CLAIMS, UNREADABLE, evaluate
from hopfield.claims.report import JSON_FILE, MARKDOWN_FILE, write_ledger
from hopfield.cli import main

KEYS = {"id", "paper", "claim", "kind", "paper_value", "ours", "seeds", "interval", "test",
        "verdict", "scale", "command"}  # fmt: skip

THEORY_COLUMNS = ["paper", "statement", "kind", "check", "trials", "violations", "worst margin",
                  "status"]  # fmt: skip


def write_record(
    root: Path,
    name: str,
    *,
    preset: str = "small",
    metrics: dict[str, float] | None = None,
    tables: list[dict[str, Any]] | None = None,
    limits: dict[str, Any] | None = None,
    side: dict[str, Any] | None = None,
) -> None:
    """``root/name/results.json`` as the runner writes it, with side files."""
    folder = root / name
    folder.mkdir(parents=True)
    record = {
        "experiment": name,
        "preset": preset,
        "config": {"iterations": 2},
        "limits": limits or {"stop_after": None, "micro_batch_size": None, "stand_in_data": False},
        "results": {"tables": tables or [], "metrics": metrics or {}, "figures": [], "notes": []},
    }
    (folder / "results.json").write_text(json.dumps(record))
    for relative, data in (side or {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(json.dumps(data))


def formation_runs() -> dict[str, dict[str, float]]:
    """compare.json runs: the W8A8 gaps of docs/outlier-formation.md (vanilla 5.9, 4.4, 2.8 %;
    OutEffHop 9.2, 2.8, 7.4 %) and sink masses that Softmax_1 lowers in every seed."""
    runs = {}
    for variant, gaps, masses in (
        ("softmax", (5.9, 4.4, 2.8), (0.62, 0.70, 0.55)),
        ("softmax1", (9.2, 2.8, 7.4), (0.10, 0.15, 0.08)),
    ):
        for seed, (gap, mass) in enumerate(zip(gaps, masses, strict=True)):
            runs[f"{variant}/seed{seed}"] = {
                "fp_ppl": 12.0 + seed, "w8a8_ppl": (12.0 + seed) * (1 + gap / 100),
                "avg_kurtosis": 25.0, "max_inf_norm": 300.0 + seed, "special_mass": mass,
                "row_sum": 1.0,
            }  # fmt: skip
    return runs


def noise_points() -> list[dict[str, Any]]:
    """A four-way tie: every model retrieves 0.016 of the patterns in each of 4 memory sets."""
    return [
        {"dataset": "digits", "query": "noise", "model": model, "study": "outeffhop",
         "steps": 2, "sigma": sigma, "values": {"rel": [0.016] * 4, "cos": [0.5] * 4}}
        for model in ("dense", "outeffhop", "sparse", "poly10")
        for sigma in (0.1, 1.0)
    ]  # fmt: skip


@pytest.fixture
def synthetic(tmp_path: Path) -> dict[str, dict[str, Any]]:
    rows = [
        ["OutEffHop Lemma 2.1", "OutEffHop energy never increases along its update", "theorem",
         "-", 216, 0, 0.0, "pass"],
        ["OutEffHop Thm 3.1", "OutEffHop iterates converge to stationary points of H", "theorem",
         "-", 216, 3, 0.0, "fail"],
        ["OutEffHop Lemma C.6", "Softmax_1 is 2-Lipschitz (ℓ∞ → ℓ1)", "info", "-", 10, 0, 1.0,
         "info"],
    ]  # fmt: skip
    write_record(
        tmp_path, "theory",
        tables=[{"name": "Theory checks", "columns": THEORY_COLUMNS, "rows": rows}],
    )  # fmt: skip
    write_record(
        tmp_path, "outlier-formation", metrics={"recipe_found": 1.0},
        side={"compare.json": {"runs": formation_runs()}},
    )  # fmt: skip
    write_record(
        tmp_path, "noise-robustness",
        side={"noise_checkpoint.json": {"cases": {"a": {"points": noise_points()}}}},
    )  # fmt: skip
    smoke = {"stop_after": 2, "micro_batch_size": 1, "stand_in_data": True}
    sudoku = {"hyperset": {"params": 5_195_584, "board": [0.0] * 48},
              "transformer": {"params": 7_156_992, "board": [0.0] * 48}}  # fmt: skip
    write_record(
        tmp_path, "hyperset-sudoku", preset="paper", limits=smoke, side={"runs.json": sudoku}
    )
    mim = {"hyperset": {"params": 3_937_856}, "transformer": {"params": 8_654_848}}
    write_record(tmp_path, "hyperset-mim", preset="paper", limits=smoke, side={"runs.json": mim})
    paths = write_ledger(tmp_path)
    assert [p.name for p in paths] == [JSON_FILE, MARKDOWN_FILE]
    return {r["id"]: r for r in json.loads((tmp_path / JSON_FILE).read_text())}


def test_every_claim_is_declared_once_and_well_formed() -> None:
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids)) and len(ids) >= 71
    prefixes = {"outeffhop": "OEH-", "nonparametric": "NP-", "hyperset": "HS-"}
    for claim in CLAIMS:
        assert claim.id.startswith(prefixes[claim.paper]), claim.id
        assert re.fullmatch(r"[A-Z]+-[A-Za-z0-9.\-]+", claim.id), claim.id
        assert claim.statement.endswith("."), claim.id
    for paper in prefixes:
        assert sum(c.paper == paper for c in CLAIMS) >= 20
    assert {"OEH-T1-kurtosis-opt", "OEH-T1-w8a8-opt", "NP-T4.1-bound", "HS-F3-sudoku"} <= set(ids)


def test_claims_name_registered_experiments() -> None:
    from hopfield.experiments.registry import all_experiments

    known = {e.name for e in all_experiments()}
    for claim in CLAIMS:
        assert set(claim.experiments) <= known, claim.id


def test_verdicts_from_synthetic_records(synthetic: dict[str, dict[str, Any]]) -> None:
    assert len(synthetic) == len(CLAIMS)
    for record in synthetic.values():
        assert set(record) >= KEYS and record["verdict"] in VERDICTS
        assert UNREADABLE not in record["note"], record["id"]
    assert synthetic["OEH-L2.1-energy"]["verdict"] == "holds"
    assert synthetic["OEH-T3.1-convergence"]["verdict"] == "does not hold"
    assert synthetic["OEH-T3.1-convergence"]["ours"] == 3
    lipschitz = synthetic["OEH-C6-lipschitz"]  # its row is an info row: never a claim
    assert lipschitz["verdict"] == "not run" and "info row" in lipschitz["note"]

    gap = synthetic["OEH-T1-w8a8-opt"]  # the numbers: t ≈ 1.11, p ≈ 0.38 over 3 seeds
    assert gap["verdict"] == "inconclusive" and gap["seeds"] == 3
    assert gap["scale"] == "small" and gap["experiment"] == "outlier-formation"
    assert gap["ours"] == pytest.approx((9.2 + 2.8 + 7.4) / 3)
    assert gap["difference"] == pytest.approx(-2.1)
    assert abs(gap["test"]["t"]) == pytest.approx(1.1125, abs=1e-4)
    assert gap["test"]["p_t"] == pytest.approx(0.3817, abs=1e-4)
    assert gap["interval"][0] < 0 < gap["interval"][1]
    assert gap["test"]["p_wilcoxon"].startswith("not computable")
    assert gap["command"] == "hopfield run outlier-formation --preset small"
    assert synthetic["OEH-S2.1-sink-opt"]["verdict"] == "holds"
    assert synthetic["OEH-T1-gated-opt"]["verdict"] == "not run"

    tie = synthetic["OEH-F6-noise"]  # four-way tie over 4 memory sets: "beats" does not hold
    assert tie["verdict"] == "does not hold" and tie["seeds"] == 4
    assert [c["rival"] for c in tie["comparisons"]] == ["dense", "sparse", "poly10"]
    assert all(c["verdict"] == "does not hold" and c["difference"] == 0 for c in tie["comparisons"])
    assert tie["test"]["p_decision"] == 1.0
    assert synthetic["OEH-F6-noise-impact"]["verdict"] == "does not hold"

    assert synthetic["HS-S4.5-params-sudoku"]["verdict"] == "holds"  # 5,195,584 vs 5.20 M
    assert synthetic["HS-T2-params-mim"]["verdict"] == "holds"  # 3,937,856 vs 3.94 M
    assert synthetic["HS-T2-params-mim-transformer"]["verdict"] == "does not hold"  # 8.65 vs 8.85
    smoke = synthetic["HS-F3-sudoku"]  # a smoke run tests no empirical claim
    assert smoke["verdict"] == "not run" and "smoke run" in smoke["note"]
    assert synthetic["HS-T2-mim"]["verdict"] == "not run"  # a smoke run, before it is a toy

    untested = [c.id for c in CLAIMS if c.experiment is None]
    assert all(synthetic[i]["verdict"] == "not implemented" for i in untested)
    absent = synthetic["NP-T6-window"]
    assert absent["verdict"] == "not run" and absent["scale"] is None
    assert absent["command"] == "hopfield run timeseries-hopfield --preset small"


def test_markdown_groups_by_paper_with_totals(
    synthetic: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    text = (tmp_path / MARKDOWN_FILE).read_text()
    counts = {v: sum(r["verdict"] == v for r in synthetic.values()) for v in VERDICTS}
    totals = ", ".join(f"{v}: {n}" for v, n in counts.items() if n)
    assert f"**Totals ({len(CLAIMS)} claims):** {totals}." in text
    order = [text.index(f"**{t}") for t in ("OutEffHop", "Nonparametric", "Hyper-SET")]
    assert order == sorted(order)
    assert "| `OEH-T1-w8a8-opt` |" in text and "**inconclusive**" in text
    assert text.count("\n| `") == len(CLAIMS)
    tie_row = next(line for line in text.splitlines() if line.startswith("| `OEH-F6-noise` |"))
    for rival in ("vs dense", "; vs sparse", "; vs poly10"):  # every rival, not only the decider
        assert rival in tie_row


def test_judge_combines_rivals_and_checks_exact_values() -> None:
    claim = Claim("X-1", "outeffhop", "T", "A claim.", None, "m", "higher", "empirical", "e",
                  lambda r: [])  # fmt: skip
    wins = Comparison("a", (2.0, 3.0, 4.0, 5.0), (1.0, 1.5, 2.0, 2.5), ("s0", "s1", "s2", "s3"))
    unclear = Comparison("b", (1.0, 2.0, 1.0, 2.0), (1.5, 1.5, 1.5, 1.5), wins.units)
    loses = Comparison("c", (1.0, 1.0, 1.1, 0.9), (2.0, 2.1, 2.0, 1.9), wins.units)
    assert judge(claim, [wins]).verdict == "holds"
    mixed = judge(claim, [wins, unclear])
    assert mixed.verdict == "inconclusive" and mixed.deciding == 1
    failing = judge(claim, [wins, unclear, loses])
    assert failing.verdict == "does not hold" and failing.deciding == 2
    assert failing.ours == pytest.approx(1.0)
    exact = Claim("X-2", "hyperset", "T", "A count.", 8.85e6, "parameters", "equal", "exact",
                  "e", lambda r: Measured(0.0), tolerance=0.005e6)  # fmt: skip
    assert judge(exact, Measured(8_654_848)).verdict == "does not hold"
    assert judge(exact, Measured(8_852_000)).verdict == "holds"
    relative = Claim("X-3", "outeffhop", "T", "Parity.", None, "ppl", "equal", "empirical", "e",
                     lambda r: [], min_effect=5.0, relative=True)  # fmt: skip
    parity = Comparison("v", (10.1, 9.9, 10.2, 10.0), (10.0, 10.0, 10.0, 10.1), wins.units)
    assert judge(relative, [parity]).verdict == "holds"  # within ±5 %
    with pytest.raises(TypeError):
        judge(claim, Measured(1.0))


def test_bad_claims_are_refused() -> None:
    with pytest.raises(ValueError, match="paper"):
        Claim("X", "other", "T", "S.", 0, "m", "equal", "exact", None)
    with pytest.raises(ValueError, match="extractor"):
        Claim("X", "hyperset", "T", "S.", 0, "m", "equal", "exact", "theory")
    with pytest.raises(ValueError, match="margin"):
        Claim("X", "hyperset", "T", "S.", None, "m", "equal", "empirical", "e", lambda r: [])


def test_a_record_of_another_layout_is_reported_not_fatal(tmp_path: Path) -> None:
    write_record(
        tmp_path, "outlier-formation", metrics={"recipe_found": 1.0},
        side={"compare.json": {"runs": {"softmax/seed0": {"fp_ppl": 1.0}}}},
    )  # fmt: skip
    records = {r["id"]: r for r in evaluate(tmp_path)}
    assert records["OEH-T1-kurtosis-opt"]["verdict"] == "not run"
    assert UNREADABLE in records["OEH-T1-kurtosis-opt"]["note"]


def test_cli_claims_and_reproduce_on_real_tiny_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``hopfield reproduce`` ends with the ledger; ``hopfield claims`` rewrites it."""
    assert main(["reproduce", "--preset", "tiny", "--out", str(tmp_path), "--no-progress",
                 "--only", "theory", "noise-robustness"]) == 0  # fmt: skip
    assert "claims:" in capsys.readouterr().out
    records = {r["id"]: r for r in json.loads((tmp_path / JSON_FILE).read_text())}
    theory = [c.id for c in CLAIMS if c.experiment == "theory"]
    printed = {"OEH-T3.2-bound", "OEH-C3.2.1-closer"}  # fail where they are tight
    assert all(records[i]["scale"] == "tiny" for i in theory)
    assert all(records[i]["verdict"] == "does not hold" for i in printed)
    assert all(records[i]["verdict"] == "holds" for i in theory if i not in printed)
    noise = records["OEH-F6-noise"]
    assert noise["seeds"] == 3 and noise["verdict"] in ("inconclusive", "holds", "does not hold")
    assert all(UNREADABLE not in r["note"] for r in records.values())
    (tmp_path / JSON_FILE).unlink()
    assert main(["claims", str(tmp_path)]) == 0
    assert json.loads((tmp_path / JSON_FILE).read_text()) == list(records.values())
    with pytest.raises(SystemExit, match="not a directory"):
        main(["claims", str(tmp_path / "absent")])


def test_docs_list_the_declared_and_unimplemented_claims() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "claims.md").read_text()
    unimplemented = text.split("Not implemented (no experiment tests them):")[1].split("##")[0]
    listed = set(re.findall(r"`([A-Z]+-[A-Za-z0-9.\-]+)`", unimplemented))
    assert listed == {c.id for c in CLAIMS if c.experiment is None}
    counts = {p: sum(c.paper == p for c in CLAIMS) for p in ("outeffhop", "nonparametric")}
    assert f"{len(CLAIMS)} claims: {counts['outeffhop']} of OutEffHop" in text
    assert f"{counts['nonparametric']} of the nonparametric models" in text
    assert f"{len(CLAIMS) - sum(counts.values())} of Hyper-SET" in text


def test_the_decisive_outlier_test_counts_only_arms_that_pass_the_gate(tmp_path: Path) -> None:
    """Decisive records pair over the arms × seeds whose vanilla and gated runs pass the
    validity gate; an arm failing it is uninformative, and with every arm failing the outlier
    claims are not tested at this scale (the FP-parity claim needs no outliers)."""
    arms = {"a": {}, "b": {"recall_rate": 1.0}}

    def write(passed: dict[str, float]) -> dict[str, dict[str, Any]]:
        root = tmp_path / "-".join(f"{k}{v:g}" for k, v in passed.items())
        write_record(
            root, "outlier-formation", preset="decisive",
            metrics={f"{arm}/gate_passed": v for arm, v in passed.items()},
            side={f"arms/{arm}/compare.json": {"runs": formation_runs()} for arm in arms},
        )  # fmt: skip
        path = root / "outlier-formation" / "results.json"
        record = json.loads(path.read_text())
        record["config"] = {"arms": arms}
        path.write_text(json.dumps(record))
        return {r["id"]: r for r in evaluate(root)}

    one = write({"a": 1.0, "b": 0.0})
    assert one["OEH-T1-w8a8-opt"]["seeds"] == 3  # arm a's seeds only
    both = write({"a": 1.0, "b": 1.0})
    assert both["OEH-T1-w8a8-opt"]["seeds"] == 6
    assert both["OEH-T1-w8a8-opt"]["verdict"] == "inconclusive"
    none = write({"a": 0.0, "b": 0.0})
    assert none["OEH-T1-kurtosis-opt"]["verdict"] == "premise absent at this scale"
    assert "validity gate" in none["OEH-T1-kurtosis-opt"]["note"]
    assert none["OEH-T1-fp-opt"]["seeds"] == 6


def test_a_retrieval_study_run_at_several_betas_is_read_at_the_runs_beta(tmp_path: Path) -> None:
    # OutEffHop's study sweeps β: at the run's β = 1 OutEffHop trails sparse (0.1 vs 0.3 in
    # each of 4 sets); at β = 0.02, listed last, every model retrieves nothing. Reading both
    # mixed the sweep into the claim (the later β overwrote the run's): a tie, inconclusive.
    points = [
        {"dataset": "mnist", "query": "half", "model": model, "study": "outeffhop",
         "beta": beta, "steps": 3, "size": 1000,
         "values": {"rel": [value + 0.01 * i for i in range(4)] if beta == 1.0 else [0.0] * 4}}
        for beta in (1.0, 0.02)
        for model, value in (("outeffhop", 0.1), ("dense", 0.1), ("sparse", 0.3), ("poly10", 0.0))
    ]  # fmt: skip
    write_record(
        tmp_path, "memory-capacity",
        side={"capacity_checkpoint.json": {"cases": {"a": {"points": points}}}},
    )  # fmt: skip
    results = json.loads((tmp_path / "memory-capacity" / "results.json").read_text())
    results["config"] = {"beta": 1.0}
    (tmp_path / "memory-capacity" / "results.json").write_text(json.dumps(results))
    record = {r["id"]: r for r in evaluate(tmp_path)}["OEH-F5-capacity"]
    assert record["verdict"] == "does not hold"
    assert record["rival"] == "sparse" and record["difference"] == pytest.approx(-0.2)


def test_the_ledger_renders_as_a_docs_section(synthetic: dict[str, Any], tmp_path: Path) -> None:
    from hopfield.claims.report import ledger_section
    from hopfield.report import render_doc_blocks

    section = ledger_section(tmp_path)
    assert section.startswith("Every checkable claim") and "# Claims ledger" not in section
    assert "\n### Notes\n" in section and "\n## " not in section
    assert f"`{tmp_path.name}`" in section  # the folder by its name, not a machine path
    doc = "x\n<!-- generated: claims/ledger -->\nold\n<!-- /generated -->\n"
    filled = render_doc_blocks(doc, tmp_path)
    assert filled == f"x\n<!-- generated: claims/ledger -->\n\n{section}\n\n<!-- /generated -->\n"


def stanhop_curve_runs(gaps: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """stanhop-outliers runs.json on ETTh1/24, one run per (model, seed): each counterpart's
    curve has max |x| 3 + seed/10 at decoder.0 (the figure's layer at E = 2) over three steps,
    its OutEffHop variant's that plus ``gaps[variant][seed]``; decoder.1 moves the other way (a
    wrong layer would flip the verdict). A synthetic run and a run without a curve are ignored."""

    def curve(level: float) -> list[dict[str, Any]]:
        return [{"step": s, "max_abs": {"decoder.0": level + 0.01 * s, "decoder.1": 9 - level}}
                for s in (1, 2, 3)]  # fmt: skip

    runs: dict[str, dict[str, Any]] = {}
    for old, new in (("dense", "outeffhop"), ("clipped", "clipped_outeffhop"),
                     ("gated", "gated_outeffhop")):  # fmt: skip
        for seed, gap in enumerate(gaps[new]):
            runs[f"ETTh1|24|{old}|{seed}"] = {"curve": curve(3 + seed / 10)}
            runs[f"ETTh1|24|{new}|{seed}"] = {"curve": curve(3 + seed / 10 + gap)}
        runs[f"synthetic|8|{new}|0"] = {"curve": curve(100.0)}
    runs["ETTh1|48|outeffhop|0"] = {"max_inf_norm": 1.0}  # recorded before curves were kept
    return runs


def test_the_figure_2d_claim_pairs_training_curves_per_setting_and_seed(tmp_path: Path) -> None:
    def verdict(name: str, gaps: dict[str, list[float]]) -> dict[str, Any]:
        write_record(tmp_path / name, "stanhop-outliers",
                     side={"runs.json": stanhop_curve_runs(gaps)})  # fmt: skip
        path = tmp_path / name / "stanhop-outliers" / "results.json"
        record = json.loads(path.read_text())
        record["config"] = {"e_layers": 2}
        path.write_text(json.dumps(record))
        return {r["id"]: r for r in evaluate(tmp_path / name)}["OEH-F2d-stanhop"]

    lower = [-0.30, -0.25, -0.35, -0.28]
    one = verdict("one", {"outeffhop": lower[:1], "clipped_outeffhop": lower[:1],
                          "gated_outeffhop": lower[:1]})  # fmt: skip
    assert one["verdict"] == "inconclusive" and one["seeds"] == 1
    holds = verdict("holds", dict.fromkeys(("outeffhop", "clipped_outeffhop", "gated_outeffhop"),
                                           lower))  # fmt: skip
    assert holds["verdict"] == "holds" and holds["seeds"] == 4
    assert [c["rival"] for c in holds["comparisons"]] == ["dense", "clipped", "gated"]
    assert holds["ours"] == pytest.approx(3.02 + 0.15 + sum(lower) / 4)
    higher = [0.20, 0.30, 0.25, 0.22]
    fails = verdict("fails", {"outeffhop": lower, "clipped_outeffhop": higher,
                              "gated_outeffhop": lower})  # fmt: skip
    assert fails["verdict"] == "does not hold" and fails["rival"] == "clipped"


TABLE1_PAIRS = (("softmax", "softmax1"), ("clipped", "clipped_softmax1"),
                ("gated", "gated_softmax1"))  # fmt: skip
STANHOP_NAMES = {"softmax": "dense", "softmax1": "outeffhop", "clipped": "clipped",
                 "clipped_softmax1": "clipped_outeffhop", "gated": "gated",
                 "gated_softmax1": "gated_outeffhop"}  # fmt: skip


def outlier_run(seed: int, kurtosis: float, inf_norm: float, formed: bool = True) -> dict:
    """An outliers-study result.json: W8A8 costs 10 % of the FP metric where outliers formed."""
    return {"seed": seed, "fp": [10.0], "w8a8": [11.0 if formed else 10.0],
            "summary": {"avg_kurtosis": kurtosis, "max_inf_norm": inf_norm,
                        "max_ffn_out_inf_norm": inf_norm}}  # fmt: skip


def write_table1_study(root: Path, reductions: list[float], *, vit_outliers: bool = True,
                       stanhop: bool = True) -> dict[str, dict[str, Any]]:  # fmt: skip
    """An ``outliers`` record of BERT, OPT and ViT and a ``stanhop-outliers`` record in which every
    one of Table 1's 12 pairs reduces both outlier metrics by ``reductions[seed]`` % in seed
    ``seed``; the ledger's records of the folder."""
    side, stan = {}, {}
    for seed, reduction in enumerate(reductions):
        for old, new in TABLE1_PAIRS:
            kurtosis, inf_norm = 100.0 + seed, 50.0 + seed
            after = 1 - reduction / 100
            for family in ("bert", "opt", "vit"):
                formed = family != "vit" or vit_outliers
                scale = 1.0 if formed else 0.03
                for variant, factor in ((old, 1.0), (new, after)):
                    side[f"runs/{family}/{variant}/seed-{seed}/result.json"] = outlier_run(
                        seed, kurtosis * scale * factor, inf_norm * factor, formed
                    )
            for variant, factor in ((old, 1.0), (new, after)):
                stan[f"ETTh1|24|{STANHOP_NAMES[variant]}|{seed}"] = {
                    "avg_kurtosis": 3.0 * factor,
                    "max_inf_norm": 5.0 * factor,
                }
    stan["ETTh1|48|outeffhop|0"] = {"avg_kurtosis": 1e6, "max_inf_norm": 1e6}  # not Table 1's
    write_record(root, "outliers", side=side)
    if stanhop:
        write_record(root, "stanhop-outliers", side={"runs.json": stan})
    return {r["id"]: r for r in evaluate(root)}


def test_the_abstract_averages_pool_table_1s_twelve_pairs_per_seed(tmp_path: Path) -> None:
    holds = write_table1_study(tmp_path / "holds", [40.0, 45.0, 50.0, 42.0])
    for claim in ("OEH-abstract-kurtosis", "OEH-abstract-infnorm"):
        assert holds[claim]["verdict"] == "holds", holds[claim]["note"]
        assert holds[claim]["seeds"] == 4 and holds[claim]["ours"] == pytest.approx(44.25)
        assert holds[claim]["model"] == "mean over Table 1's 12 pairs"
    small = write_table1_study(tmp_path / "small", [5.0, 6.0, 4.0, 5.0])
    assert small["OEH-abstract-kurtosis"]["verdict"] == "does not hold"  # 5 % < the paper's 22 %
    spread = write_table1_study(tmp_path / "spread", [10.0, 60.0, 30.0])
    assert spread["OEH-abstract-infnorm"]["verdict"] == "inconclusive"  # the interval holds 26 %
    flat = write_table1_study(tmp_path / "flat", [40.0, 45.0, 50.0], vit_outliers=False)
    assert flat["OEH-abstract-kurtosis"]["verdict"] == "premise absent at this scale"
    assert "no outliers formed in vanilla vit" in flat["OEH-abstract-kurtosis"]["note"]
    alone = write_table1_study(tmp_path / "alone", [40.0, 45.0, 50.0], stanhop=False)
    assert "no stanhop-outliers results" in alone["OEH-abstract-kurtosis"]["note"]


def write_bert_layers(root: Path, seeds: int, vanilla: list[float], outeffhop: list[float],
                      ln_gap: float) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``outliers-bert`` with vanilla and OutEffHop runs of a 4-layer BERT whose FFN outputs have
    mean inf norms ``vanilla`` / ``outeffhop`` per layer (times 1 + seed/10), and whose attention
    LayerNorm output in layer 2 (= L − 2) is ``ln_gap`` larger with OutEffHop."""
    side = {}
    for seed in range(seeds):
        for variant, ffn, ln in (("softmax", vanilla, 4.0), ("softmax1", outeffhop, 4.0 + ln_gap)):
            run = outlier_run(seed, 50.0, 30.0)
            norms = [v * (1 + seed / 10) for v in ffn]
            run["layer_inf_norms"] = {
                "columns": ["layer", "output.dense", "output.LayerNorm"],
                "rows": [[str(j), v, 1.0] for j, v in enumerate(norms)],
            }
            run["component_inf_norms"] = {
                "columns": ["layer", "attention.output.LayerNorm", "output.dense"],
                "rows": [[str(j), ln + seed / 10 if j == 2 else 1.0, v]
                         for j, v in enumerate(norms)],
            }  # fmt: skip
            side[f"runs/bert/{variant}/seed-{seed}/result.json"] = run
    write_record(root, "outliers-bert", side=side)
    return {r["id"]: r for r in evaluate(root)}


def test_figures_3_and_4_read_the_per_layer_norms_of_each_seed(tmp_path: Path) -> None:
    # layers 1 and 3 of 4 are Figure 3's 3 and 10 of 12: vanilla grows 4x, OutEffHop stays flat
    # (the growth ratios are the same in every seed: no spread, so the exact sign-flip test
    # decides, and it needs 6 seeds to reach p = 2/64 < 0.05)
    grows = write_bert_layers(tmp_path / "grows", 6, [1.0, 2.0, 4.0, 8.0], [1.0, 1.1, 1.0, 1.05],
                              ln_gap=2.0)  # fmt: skip
    depth = grows["OEH-F3-depth"]
    assert depth["verdict"] == "holds" and depth["seeds"] == 6
    assert [c["rival"] for c in depth["comparisons"]] == [
        "softmax layer 3", "softmax (growth log(layer 3 / layer 1))"]  # fmt: skip
    assert grows["OEH-F4-layernorm"]["verdict"] == "holds"
    shrinks = write_bert_layers(tmp_path / "shrinks", 6, [8.0, 4.0, 2.0, 1.0], [1.0] * 4,
                                ln_gap=-2.0)  # fmt: skip
    assert shrinks["OEH-F3-depth"]["verdict"] == "does not hold"
    assert shrinks["OEH-F3-depth"]["rival"] == "softmax layer 3"  # vanilla does not grow
    assert shrinks["OEH-F4-layernorm"]["verdict"] == "does not hold"
    two = write_bert_layers(tmp_path / "two", 2, [1.0, 2.0, 4.0, 8.0], [1.0] * 4, ln_gap=2.0)
    assert two["OEH-F3-depth"]["verdict"] == two["OEH-F4-layernorm"]["verdict"] == "inconclusive"
    # the aggregates need all six variants of every model, and say which are missing
    note = two["OEH-abstract-kurtosis"]["note"]
    assert "outliers-bert has no bert runs of clipped, clipped_softmax1" in note
    assert "no outliers or outliers-opt results" in note


def test_a_record_reads_only_the_runs_of_the_variants_it_aggregated(tmp_path: Path) -> None:
    """A campaign commits each run as it lands beside an interim record: runs of a variant the
    record's config leaves out enter none of its verdicts until the record is made again."""
    grows = write_bert_layers(tmp_path, 6, [1.0, 2.0, 4.0, 8.0], [1.0, 1.1, 1.0, 1.05],
                              ln_gap=2.0)  # fmt: skip
    assert grows["OEH-F4-layernorm"]["verdict"] == "holds"  # a config without variants: all runs
    path = tmp_path / "outliers-bert" / "results.json"
    record = json.loads(path.read_text())
    for variants, verdict in ((["softmax", "softmax1"], "holds"), (["softmax"], "not run")):
        record["config"] = {"variants": variants}
        path.write_text(json.dumps(record))
        judged = {r["id"]: r for r in evaluate(tmp_path)}
        assert judged["OEH-F4-layernorm"]["verdict"] == verdict, judged["OEH-F4-layernorm"]["note"]


def test_a_variant_whose_attention_carries_no_weight_tests_no_comparison(tmp_path: Path) -> None:
    """Clipped Softmax with γ = −0.025 over 128 tokens clips every weight of a small BERT to 0
    from its initialisation: Clipped Softmax and Clipped OutEffHop then train the same
    attention-free model, and their equal perplexities must not make "keeps the FP metric" hold."""

    def judged(clipped_row_sum: float) -> dict[str, Any]:
        side = {}
        for seed in range(3):
            for variant, fp, row_sum in (("softmax", 449.0, 1.0), ("softmax1", 449.5, 0.9),
                                         ("clipped", 540.0, clipped_row_sum),
                                         ("clipped_softmax1", 540.5, clipped_row_sum)):  # fmt: skip
                run = outlier_run(seed, 3.5, 4.0, formed=False)
                run["fp"] = [fp + seed * (1.1 if "1" in variant else 1.0)]
                run["attention"] = {f"layer.{i}": {"row_sum": row_sum, "special_mass": 0.0}
                                    for i in range(2)}  # fmt: skip
                side[f"runs/bert/{variant}/seed-{seed}/result.json"] = run
        folder = tmp_path / str(clipped_row_sum)
        write_record(folder, "outliers-bert", side=side)
        return {r["id"]: r for r in evaluate(folder)}

    dead = judged(0.0)
    claim = dead["OEH-T1-clipped-fp-bert"]
    assert claim["verdict"] == "premise absent at this scale", claim["note"]
    assert "clipped_softmax1 attention carries no weight in bert" in claim["note"]
    assert "sum to 0 a row (mean of 3 runs" in claim["note"]
    assert dead["OEH-T1-fp-bert"]["verdict"] == "holds"  # vanilla and OutEffHop are alive
    live = judged(0.5)  # the same numbers from attention that carries weight: judged
    assert live["OEH-T1-clipped-fp-bert"]["verdict"] == "holds", live["OEH-T1-clipped-fp-bert"]


def efficiency_flops_record(
    root: Path, sparse_factor: float, table_name: str = "Matrix-product FLOPs"
) -> dict[str, Any]:
    """An efficiency record whose layer FLOPs fall as the figure says, with sparsemax at
    ``sparse_factor`` times dense's, in the table ``table_name``."""
    sizes = (256, 1024, 4096)
    models = {"dense": lambda n: n * n, "sparsemax": lambda n: sparse_factor * n * n,
              "window-16": lambda n: 40.0 * n, "linear": lambda n: 16.0 * n,
              "rf": lambda n: 17.0 * n, "rf-relu": lambda n: 17.0 * n}  # fmt: skip
    rows = [["layer", d, model, *(count(n) * d for n in sizes)]
            for d in (16, 64) for model, count in models.items()]  # fmt: skip
    rows.append(["association", 16, "sparsemax", *(10.0 * n * n for n in sizes)])  # not judged
    table = {"name": table_name, "columns": ["mode", "d", "model"] + [
        f"L={n}" for n in sizes], "rows": rows}  # fmt: skip
    write_record(root, "efficiency", tables=[table])
    return {r["id"]: r for r in evaluate(root)}["NP-F7-flops"]


def test_figure_7_is_judged_exactly_on_the_flop_counts(tmp_path: Path) -> None:
    shared = efficiency_flops_record(tmp_path / "shared", 1.05)
    assert shared["verdict"] == "holds" and shared["ours"] == 0
    assert shared["kind"] == "exact" and "0 of 14 relations fail" in shared["note"]
    sorted_ = efficiency_flops_record(tmp_path / "sort", 1.5)  # a counted sort: 1.5x dense
    assert sorted_["verdict"] == "does not hold" and sorted_["ours"] == 2  # at d = 16 and 64
    assert "sparsemax / dense 1.5-1.5" in sorted_["note"]
    # the paper counted matrix products (fvcore): every operation's count decides nothing
    every_operation = efficiency_flops_record(tmp_path / "all", 1.5, "Analytic FLOPs")
    assert every_operation["verdict"] == "not run"
    assert "no table 'Matrix-product FLOPs'" in every_operation["note"]


# ------------------------------------------------------- parameter counts from a plan record


def write_plan(root: Path, preset: str, counts: dict[tuple[str, str], int]) -> Path:
    """``root/plan/<preset>.json`` as ``hopfield plan --out`` writes it, with the jobs of
    ``counts`` (``{(experiment, job): parameters in the paper's convention}``) priced as a
    small linear model renamed."""
    from dataclasses import replace

    import torch

    from hopfield.plan import ExperimentPlan, TrainingJob, estimate, write_plan_record

    toy = estimate(
        TrainingJob(
            name="toy",
            build_model=lambda device: torch.nn.Linear(4, 2, device=device),
            make_batch=lambda n, device: torch.randn(n, 4, device=device),
            loss=lambda model, x: model(x).sum(),
            global_batch=8,
            optimizer_steps=10,
        )
    )
    jobs: dict[str, list[Any]] = {}
    for (experiment, job), count in counts.items():
        jobs.setdefault(experiment, []).append(
            replace(toy, name=job, group=job, parameters_counted=count)
        )
    plans = [
        ExperimentPlan(name, preset, 0.4, True, "a toy", jobs=tuple(priced))
        for name, priced in jobs.items()
    ]
    return write_plan_record(plans, root, command=f"hopfield plan --all --preset {preset}")


def test_parameter_counts_are_judged_from_a_plan_record(tmp_path: Path) -> None:
    write_plan(tmp_path, "paper", {
        ("hyperset-images", "hyperset"): 962_218,  # 0.96 M ± 0.005 M
        ("hyperset-images", "transformer"): 1_784_000,  # 1.79 M: 6,000 short
        ("outliers-vit", "vit softmax"): 22_050_664,  # the paper prints 22.03m
        ("stanhop-outliers", "ETTh1 T168→24 outeffhop"): 35_128_648,
    })  # fmt: skip
    write_record(tmp_path, "hyperset-images", preset="small", side={"runs.json": {}})
    records = {r["id"]: r for r in evaluate(tmp_path)}
    small = records["HS-T1-params-small"]
    assert small["verdict"] == "holds" and small["ours"] == 962_218
    assert small["scale"] == "plan (paper preset, meta device)"
    assert small["command"] == "hopfield plan hyperset-images --preset paper"
    assert small["experiment"] == "hyperset-images" and "962,218 parameters" in small["note"]
    assert records["HS-T1-params-transformer"]["verdict"] == "does not hold"
    vit = records["OEH-T1-params-vit"]  # from the plan of outliers-vit, after outliers
    assert vit["verdict"] == "does not hold" and vit["experiment"] == "outliers-vit"
    assert records["OEH-T1-params-stanhop"]["verdict"] == "holds"
    missing = records["HS-T1-params-et"]  # the plan has no job "et"
    assert missing["verdict"] == "not run" and "no job 'et'" in missing["note"]
    assert records["HS-T1-params-et"]["scale"] == "small"  # the first record tried
    assert records["OEH-T1-params-bert"]["verdict"] == "not run"  # no plan
    # only parameter counts are read from a plan; the other claims need runs
    equal_width = records["HS-T1-equal-width"]
    assert equal_width["verdict"] == "not run"
    assert equal_width["scale"] == "small"


def test_a_paper_run_comes_before_the_plan_and_another_preset_tests_nothing(
    tmp_path: Path,
) -> None:
    write_plan(tmp_path, "paper", {("hyperset-mim", "transformer"): 8_654_848})
    write_plan(tmp_path, "small", {("hyperset-sudoku", "hyperset"): 5_195_584})
    mim = {"transformer": {"params": 8_852_000}}  # a GPU user's paper run
    write_record(tmp_path, "hyperset-mim", preset="paper", side={"runs.json": mim})
    records = {r["id"]: r for r in evaluate(tmp_path)}
    run = records["HS-T2-params-mim-transformer"]
    assert run["verdict"] == "holds" and run["scale"] == "paper" and run["ours"] == 8_852_000
    sudoku = records["HS-S4.5-params-sudoku"]
    assert sudoku["verdict"] == "not run"
    assert "only at the paper preset, not small" in sudoku["note"]


@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[1] / "results" / "plan" / "paper.json").is_file(),
    reason="no committed plan record",
)
def test_the_committed_plan_record_judges_every_parameter_count() -> None:
    """results/plan/paper.json gives every parameter-count claim an exact verdict (the counts
    against the papers': docs/scale.md)."""
    from hopfield.claims.records import load_plans

    plans = load_plans(Path(__file__).resolve().parents[1] / "results")
    claims = [c for c in CLAIMS if c.planned]
    assert len(claims) == 20  # 12, Table 20's four and Table 4's LoRA increments (Hyper-SET)
    failing = {"OEH-T1-params-vit", "HS-T2-params-mim-transformer"}  # 22.05 M, 8.65 M
    for claim in claims:
        (plan, *_) = [p for name in claim.experiments for p in plans.get(name, [])]
        judgement = judge(claim, plan.parameters(claim.planned, base=claim.planned_base))
        assert judgement.verdict == ("does not hold" if claim.id in failing else "holds"), claim.id


def test_every_committed_preset_is_read_the_largest_first(tmp_path: Path) -> None:
    """A second preset's record (``outlier-formation-small``) is read under the experiment it
    names; the largest preset that tests a claim decides, and the record says which one."""
    write_record(tmp_path, "theory", preset="tiny", tables=[
        {"name": "Theory checks", "columns": THEORY_COLUMNS, "rows": [
            ["OutEffHop Lemma 2.1", "OutEffHop energy never increases", "theorem", "-", 5, 1,
             0.0, "fail"]]}])  # fmt: skip
    (tmp_path / "theory").rename(tmp_path / "theory-tiny")
    write_record(tmp_path, "theory", preset="paper", tables=[
        {"name": "Theory checks", "columns": THEORY_COLUMNS, "rows": [
            ["OutEffHop Lemma 2.1", "OutEffHop energy never increases", "theorem", "-", 9, 0,
             0.0, "pass"]]}])  # fmt: skip
    records = {r["id"]: r for r in evaluate(tmp_path)}
    energy = records["OEH-L2.1-energy"]
    assert energy["verdict"] == "holds" and energy["scale"] == "paper"
    shutil.rmtree(tmp_path / "theory")
    alone = {r["id"]: r for r in evaluate(tmp_path)}["OEH-L2.1-energy"]
    assert alone["verdict"] == "does not hold" and alone["scale"] == "tiny (theory-tiny)"
    assert alone["experiment"] == "theory"


def test_an_untested_claim_says_which_way(tmp_path: Path) -> None:
    """A claim no record tests is ``not run``; where one record's premise is absent (no
    outliers formed) that, the most informative, wins over another's ``not run``."""
    from hopfield.claims.claim import NotTested

    def extract(record: Any) -> Any:
        if record.preset == "paper":
            raise NotTested("a smoke run")
        raise NotTested("no outliers formed (W8A8 costs 0.1 %)", "premise absent at this scale")

    claim = Claim("X-9", "outeffhop", "T", "S.", None, "m", "lower", "empirical", "theory",
                  extract)  # fmt: skip
    (alone,) = evaluate(tmp_path, (claim,))
    assert alone["verdict"] == "not run" and "no theory results" in alone["note"]
    write_record(tmp_path, "theory", preset="paper")
    (smoke,) = evaluate(tmp_path, (claim,))
    assert smoke["verdict"] == "not run"
    (tmp_path / "theory").rename(tmp_path / "theory-paper")  # a second preset beside it
    write_record(tmp_path, "theory", preset="small")
    (both,) = evaluate(tmp_path, (claim,))
    assert both["verdict"] == "premise absent at this scale" and "W8A8 costs" in both["note"]
    with pytest.raises(ValueError, match="kind"):
        NotTested("why", "untested")


def test_a_record_below_its_training_premise_tests_no_empirical_claim(tmp_path: Path) -> None:
    """The Sudoku Transformer solved no board: the Sudoku claims are premise-absent with the
    measured 0 %, the parameter counts still hold; at 30 % boards the premise is met."""
    board = [0.0] * 48

    def sudoku(transformer_boards: float) -> dict[str, dict[str, Any]]:
        shutil.rmtree(tmp_path / "hyperset-sudoku", ignore_errors=True)
        runs = {"hyperset": {"params": 5_195_584, "board": [40.0] * 48},
                "transformer": {"params": 7_156_992, "board": board}}  # fmt: skip
        write_record(tmp_path, "hyperset-sudoku", preset="paper",
                     metrics={"transformer_board_acc": transformer_boards},
                     side={"runs.json": runs})  # fmt: skip
        return {r["id"]: r for r in evaluate(tmp_path)}

    untrained = sudoku(0.0)
    assert untrained["HS-F3-sudoku"]["verdict"] == "premise absent at this scale"
    assert "solved 0 % of the test boards" in untrained["HS-F3-sudoku"]["note"]
    assert untrained["HS-S4.5-params-sudoku"]["verdict"] == "holds"  # counts need no training
    trained = sudoku(30.0)
    assert trained["HS-F3-sudoku"]["verdict"] != "premise absent at this scale"


def test_datasets_and_sizes_are_strata_and_only_seeds_and_repeats_replicate(
    tmp_path: Path,
) -> None:
    """MIL: one comparison per dataset over seeds (folds averaged within a seed); speed: one per
    (d, L) point over the repeated timings there, on log CPU seconds."""
    runs = {
        f"{dataset}/{method}/{seed}/{fold}": {"test_auc": base + 0.01 * seed + 0.001 * fold}
        for dataset in ("tiger", "fox", "elephant")
        for method, base in (("sparse", 0.80), ("dense", 0.70))
        for seed in range(3)
        for fold in range(5)
    }
    write_record(tmp_path, "mil-benchmark", side={"runs.json": {"runs": runs}})
    points = {
        f"layer|16|{model}|{size}": {"cpu_seconds": t, "cpu_samples": [t * (1 + jitter * i)
                                                                       for i in range(4)]}
        for size in (512, 1024, 2048, 4096)
        for model, t, jitter in (("dense", 1e-5 * size**2, 0.02), ("linear", 1e-3 * size, 0.05))
    }  # fmt: skip
    write_record(tmp_path, "efficiency", side={"measurements.json": {"points": points}})
    records = {r["id"]: r for r in evaluate(tmp_path)}
    sparse = records["NP-T5-sparse"]
    assert [c["rival"] for c in sparse["comparisons"]] == [
        "dense on tiger", "dense on fox", "dense on elephant"]  # fmt: skip
    assert all(c["n"] == 3 and c["units"] == ["seed 0", "seed 1", "seed 2"]
               for c in sparse["comparisons"])  # fmt: skip
    assert sparse["verdict"] == "holds"  # 0.1 higher in every seed of every dataset
    fast = records["NP-F6-fast"]
    assert {c["rival"] for c in fast["comparisons"]} == {
        "dense at d=16 L=2048 (log CPU s)", "dense at d=16 L=4096 (log CPU s)"}  # fmt: skip
    assert all(c["n"] == 4 for c in fast["comparisons"]) and fast["verdict"] == "holds"


def test_a_planned_increment_is_the_difference_of_two_jobs() -> None:
    """Table 4's LoRA claims: the count of the LoRA job less the base job's, from the plan."""
    from hopfield.claims.hyperset import CLAIMS as HYPERSET

    lora = {c.id: c for c in HYPERSET}["HS-T4-params-lora4"]
    assert (lora.planned, lora.planned_base) == ("hyperset-scaleup-lora4", "hyperset-scaleup")
    assert lora.paper_value == 100_000 and lora.tolerance == 10_000
    with pytest.raises(ValueError, match="planned_base needs planned"):
        replace(lora, planned="")


def test_sudoku_replicates_decide_the_extrapolation_claims(tmp_path: Path) -> None:
    """Fig. 3b over 3 seeds (L = 2): Hyper-SET beats the Transformer at 2L and gains more from
    L to 2L; the runs pair by seed (``<model>.seed<r>``), once the Transformer learned."""
    boards = {"hyperset": [50.0, 55.0, 56.0, 57.0], "transformer": [40.0, 41.0, 41.5, 42.0]}
    runs = {
        f"{model}{'' if r == 0 else f'.seed{r}'}": {
            "board": [b + r for b in board],
            "cell": [0.0] * 4,
            "params": 1,
        }
        for r in range(3)
        for model, board in boards.items()
    }
    runs["hyperset.seed2"]["board"][3] += 0.5  # some spread between the seeds
    metrics = {"transformer_board_acc": 41.0}
    write_record(tmp_path, "hyperset-sudoku", metrics=metrics, side={"runs.json": runs})
    records = {r["id"]: r for r in evaluate(tmp_path)}
    beyond, gain = records["HS-F3-beyond-training"], records["HS-F3-larger-gain"]
    assert beyond["units"] == ["run 0", "run 1", "run 2"]
    assert beyond["verdict"] == "holds" and beyond["ours"] == pytest.approx(57 + 1 + 0.5 / 3)
    assert gain["verdict"] == "holds"
    assert gain["ours"] == pytest.approx(2 + 0.5 / 3) and gain["rival_value"] == 1.0


def test_sudoku_energy_and_uniformity_claims_read_every_replicate(tmp_path: Path) -> None:
    """Figs. 5-6 over 3 seeds (L = 2, a third row past L is extrapolation and left out): the
    energies fall and the effective rank rises in every seed (holds); the angle rises in seed 0
    only, which a read of seed 0 alone would have taken for the whole record."""

    def rows(r: int) -> list[dict[str, float]]:
        angle = [10.0, 20.0] if r == 0 else [20.0, 20.0 - r]
        return [
            {"e_attn": 5.0 - r, "e_ff": 1.0, "erank": 3.0, "angle": angle[0]},
            {"e_attn": 4.0 - 1.1 * r, "e_ff": 0.5 - 0.1 * r, "erank": 4.0 + r, "angle": angle[1]},
            {"e_attn": 9.0, "e_ff": 9.0, "erank": 0.0, "angle": 90.0},
        ]

    board = [30.0] * 4
    runs = {
        f"{model}{'' if r == 0 else f'.seed{r}'}": {
            "board": board,
            "params": 1,
            **({"analysis": rows(r)} if model == "hyperset" else {}),
        }
        for r in range(3)
        for model in ("hyperset", "transformer")
    }
    write_record(tmp_path, "hyperset-sudoku", metrics={"transformer_board_acc": 30.0},
                 side={"runs.json": runs})  # fmt: skip
    records = {r["id"]: r for r in evaluate(tmp_path)}
    energy, uniformity = records["HS-F5-energy"], records["HS-F6-uniformity"]
    assert energy["units"] == ["run 0", "run 1", "run 2"]
    assert energy["verdict"] == "holds"
    slopes = {c["model"]: c["ours"] for c in energy["comparisons"]}
    assert slopes["e_attn_slope"] == pytest.approx(-(1.0 + 1.1 + 1.2) / 3)
    changes = {c["model"]: c["ours"] for c in uniformity["comparisons"]}
    assert changes == pytest.approx({"erank_change": 2.0, "angle_change": 7 / 3})
    assert uniformity["verdict"] != "holds"  # the angle rose in one seed of three


def test_trajectory_readouts_are_checked() -> None:
    from hopfield.claims.extract import hyperset_trajectory

    with pytest.raises(ValueError, match="readouts"):
        hyperset_trajectory("hyperset", [("e_attn", "curvature")])


def vit_curve_run(seed: int, variant: str, peak: float, *, curve: bool = True) -> dict:
    """An ``outliers-vit`` result.json of a 4-layer ViT with outliers whose layer-2 (= L − 2)
    components peak at ``peak`` over a three-point training curve."""
    run = outlier_run(seed, 50.0, 30.0)
    run["identity"] = {"settings": {"family": "vit", "layers": 4}}
    if curve:
        run["curve"] = [
            (step, {"vit.layers.2.mlp.fc2": peak * step / 300,
                    "vit.layers.2.attention": 1.0})
            for step in (100, 200, 300)
        ]  # fmt: skip
    return run


def test_figure_2_compares_each_pair_over_its_training_curves(tmp_path: Path) -> None:
    """Fig. 2(c): OutEffHop's curve at layer L − 2 lies below vanilla's in every seed (holds);
    Gated OutEffHop's lies above Gated Attention's; a run recorded without a curve drops out."""
    peaks = {"softmax": 12.0, "softmax1": 6.0, "gated": 6.0, "gated_softmax1": 9.0}
    side = {
        f"runs/vit/{variant}/seed-{seed}/result.json": vit_curve_run(
            seed,
            variant,
            peak + seed * (0.5 if variant.endswith("softmax1") else 1.0),
            curve=(variant, seed) != ("gated", 3),
        )
        for variant, peak in peaks.items()
        for seed in range(4)
    }
    write_record(tmp_path, "outliers-vit", side=side)
    claim = {r["id"]: r for r in evaluate(tmp_path)}["OEH-F2c-vit"]
    vanilla, gated = claim["comparisons"]
    assert (vanilla["rival"], vanilla["n"], gated["rival"], gated["n"]) == (
        "softmax",
        4,
        "gated",
        3,
    )
    assert vanilla["ours"] == pytest.approx((6.0 + 0.75) * 2 / 3)  # peak·(1/3, 2/3, 1), mean
    assert claim["verdict"] == "does not hold"  # gated: 9 + seed/2 against 6 + seed


def test_figure_2_reads_every_layer_curve_of_outlier_formation(tmp_path: Path) -> None:
    from hopfield.claims.extract import _figure2_curve_mean

    curve = [(step, {f"model.decoder.layers.{j}{part}": 10.0 * j + step
                     for j in range(6) for part in ("", ".fc2")}) for step in (1, 3)]  # fmt: skip
    assert _figure2_curve_mean(curve) == pytest.approx(42.0)  # layer 4 of 6: 40 + mean(1, 3)
    assert _figure2_curve_mean(curve, layers=3) == pytest.approx(12.0)
    assert _figure2_curve_mean([]) is None
