"""MIL experiments: training one model on the Trainer (recipe, best epoch, resume), the store of
finished runs, tiny presets end to end, resuming, stand-in data, folds, trials and worker
processes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hopfield.data import DataNotFoundError
from hopfield.data.mil import FixedSizeBags, make_bit_pattern_bags
from hopfield.experiments import mil_benchmark, mil_bit_pattern, mil_mnist_bags, run_experiment
from hopfield.experiments.mil_common import (
    CHECKPOINT,
    WORK_DIR,
    MILRun,
    RunStore,
    bag_evaluator,
    bag_loss,
    mil_training_config,
    resolve_workers,
    run_tasks,
    train_mil_model,
)
from hopfield.experiments.results import RunContext
from hopfield.models.mil import MILNet, evaluate
from hopfield.training import lr_factor, read_log

# --- one model --------------------------------------------------------------------------------


def bit_bags(
    train: int = 160, valid: int = 64, seed: int = 0
) -> tuple[FixedSizeBags, FixedSizeBags, FixedSizeBags]:
    """Training, validation and test bags of 8 six-bit instances, two signal patterns."""
    options = {"num_bits": 6, "num_signals": 2}
    train_bags, signals = make_bit_pattern_bags(train, 8, seed=seed, **options)
    valid_bags, _ = make_bit_pattern_bags(valid, 8, seed=seed + 1, signals=signals, **options)
    test_bags, _ = make_bit_pattern_bags(valid, 8, seed=seed + 2, signals=signals, **options)
    return train_bags, valid_bags, test_bags


def small_net(dropout: float = 0.0, method: str = "dense") -> MILNet:
    torch.manual_seed(0)
    return MILNet(
        6,
        embedding_size=32,
        num_heads=2,
        quantity=2,
        scale=1.0,
        dropout=dropout,
        method=method,
        seed=5,
    )


def prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}


def test_train_mil_model_learns_and_restores_the_first_best_epoch(tmp_path: Path) -> None:
    train, valid, test = bit_bags()
    net = small_net()
    config = mil_training_config(
        RunContext(tmp_path), epochs=15, batch_size=32, lr=5e-3, select_by="accuracy"
    )
    run = train_mil_model(net, train, {"valid": valid, "test": test}, tmp_path / "run", config)
    curves = run.curves
    assert set(curves) == {"train_loss", "train_accuracy"} | {
        f"{s}_{m}" for s in ("valid", "test") for m in ("loss", "accuracy", "auc")
    }
    assert all(len(c) == 15 for c in curves.values())
    assert curves["train_loss"][-1] < curves["train_loss"][0]
    assert curves["train_accuracy"][-1] > curves["train_accuracy"][0]
    assert run.steps == 15 * 5 and run.finished and run.resumed_from is None
    assert run.processes == 1 and run.parameters == sum(p.numel() for p in net.parameters())
    assert run.record() == {
        "best_epoch": run.best_epoch,
        "steps": 75,
        "finished": True,
        "resumed_from": None,
        "parameters": run.parameters,
    }
    best = curves["valid_accuracy"].index(max(curves["valid_accuracy"]))  # the first of ties
    assert run.best_epoch == best + 1 and run.best["valid_accuracy"] >= 0.9
    assert run.best == {k: v[best] for k, v in curves.items() if not k.startswith("train")}
    # the model holds the best epoch's weights
    assert evaluate(net, valid) == pytest.approx(prefixed(run.best, "valid_"))
    assert evaluate(net, test) == pytest.approx(prefixed(run.best, "test_"))


def test_train_mil_model_recipe_cosine_per_step_and_loss_selection(tmp_path: Path) -> None:
    train, valid, _ = bit_bags(train=100)  # 100 bags at batch 32: 3 steps, 4 bags dropped
    config = mil_training_config(
        RunContext(tmp_path), epochs=4, batch_size=32, lr=2e-3, select_by="loss", seed=3
    )
    run = train_mil_model(small_net(), train, {"valid": valid}, tmp_path / "run", config)
    log = read_log(tmp_path / "run")
    assert [r["step"] for r in log] == [3, 6, 9, 12] and run.steps == 12
    for record in log:  # the learning rate of each epoch's last step: cosine to 0 over 12 steps
        expected = 2e-3 * 0.5 * (1 + math.cos(math.pi * (record["step"] - 1) / 12))
        assert record["lr"] == pytest.approx(expected)
        assert record["lr"] == pytest.approx(2e-3 * lr_factor(record["step"] - 1, config, 12))
    losses = run.curves["valid_loss"]
    assert run.best_epoch == losses.index(min(losses)) + 1
    assert run.best["valid_loss"] == min(losses)


def test_mil_training_config() -> None:
    ctx = RunContext(Path("/tmp"), stop_after=7, micro_batch_size=2)
    config = mil_training_config(ctx, epochs=3, batch_size=8, lr=1e-4, weight_decay=1e-3)
    assert (config.optimizer, config.schedule, config.min_lr_ratio, config.warmup_steps) == (
        "adamw",
        "cosine",
        0.0,
        0,
    )
    assert config.weight_decay == 1e-3 and config.decay_norm_weights and config.grad_clip == 1.0
    assert (config.select_metric, config.select_mode, config.restore_best) == (
        "valid_auc",
        "max",
        True,
    )
    assert (config.eval_every, config.log_every, config.checkpoint_every) == ("epoch", "epoch", 0)
    assert (config.stop_after, config.micro_batch_size) == (7, 2)  # the run limits apply
    loss = mil_training_config(ctx, epochs=1, batch_size=8, select_by="loss")
    assert (loss.select_metric, loss.select_mode) == ("valid_loss", "min")
    accuracy = mil_training_config(ctx, epochs=1, batch_size=8, select_by="accuracy")
    assert (accuracy.select_metric, accuracy.select_mode) == ("valid_accuracy", "max")
    with pytest.raises(ValueError, match="select_by"):
        mil_training_config(ctx, epochs=1, batch_size=8, select_by="f1")
    with pytest.raises(ValueError, match="epochs"):
        mil_training_config(ctx, epochs=0, batch_size=8)


def test_train_mil_model_arguments_and_no_clipping(tmp_path: Path) -> None:
    train, valid, _ = bit_bags(train=16, valid=8)
    config = mil_training_config(RunContext(tmp_path), epochs=2, batch_size=8, grad_clip=None)
    with pytest.raises(ValueError, match="valid"):
        train_mil_model(small_net(), train, {"test": valid}, tmp_path / "a", config)
    run = train_mil_model(small_net(), train, {"valid": valid}, tmp_path / "b", config)
    assert run.steps == 4 and len(run.curves["valid_auc"]) == 2


class FixedLogits(nn.Module):
    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(logits))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.logits[: x.shape[0]]


def test_bag_loss_and_evaluator() -> None:
    model = FixedLogits([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    loss, metrics = bag_loss(model, (torch.zeros(4, 3, 2), None, labels))
    assert float(loss.detach()) == pytest.approx(
        float(F.binary_cross_entropy_with_logits(model.logits.detach(), labels))
    )
    assert float(metrics["accuracy"]) == 0.5 and loss.requires_grad
    bags, _ = make_bit_pattern_bags(6, 4, num_bits=4, num_signals=1)
    net = MILNet(4, embedding_size=8, num_heads=2)
    metrics = bag_evaluator({"a": bags, "b": bags})(net)
    assert prefixed(metrics, "a_") == evaluate(net, bags) == prefixed(metrics, "b_")


@pytest.mark.parametrize("method", ["dense", "random-mask-50"])
def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path: Path, method: str) -> None:
    """Dropout (the global RNG) and random masks (the model's generator) resume where they were."""
    train, valid, _ = bit_bags()

    def run(out: Path, stop_after: int | None = None) -> tuple[MILRun, MILNet]:
        net = small_net(dropout=0.3, method=method)
        ctx = RunContext(tmp_path / "ctx", stop_after=stop_after)
        config = mil_training_config(ctx, epochs=3, batch_size=32, checkpoint_every="epoch")
        return train_mil_model(net, train, {"valid": valid}, out, config), net

    full, full_net = run(tmp_path / "full")
    cut, _ = run(tmp_path / "cut", stop_after=7)  # inside the second epoch
    assert (cut.steps, cut.finished, cut.best_epoch) == (7, False, 1)
    assert len(cut.curves["valid_loss"]) == 1
    resumed, resumed_net = run(tmp_path / "cut")
    assert resumed.resumed_from == 7 and resumed.finished and resumed.steps == 15
    assert resumed.curves == full.curves and resumed.best == full.best
    assert resumed.best_epoch == full.best_epoch
    for (name, a), b in zip(
        full_net.state_dict().items(), resumed_net.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    again, _ = run(tmp_path / "cut")  # a finished run is not trained again
    assert again.resumed_from == 15 and again.curves == full.curves


def test_a_run_cut_inside_its_first_epoch_evaluates_its_final_weights(tmp_path: Path) -> None:
    train, valid, test = bit_bags()
    net = small_net()
    config = mil_training_config(RunContext(tmp_path, stop_after=2), epochs=3, batch_size=32)
    run = train_mil_model(net, train, {"valid": valid, "test": test}, tmp_path / "run", config)
    assert (run.steps, run.finished, run.best_epoch) == (2, False, None)
    assert run.curves == {"train_loss": [], "train_accuracy": []}
    assert prefixed(run.best, "test_") == pytest.approx(evaluate(net, test))


def test_without_a_valid_auc_the_last_epoch_counts(tmp_path: Path) -> None:
    train, valid, _ = bit_bags(train=64, valid=16)
    negatives = FixedSizeBags(valid.pool, valid.members, torch.zeros(len(valid)))  # AUC is NaN
    config = mil_training_config(RunContext(tmp_path), epochs=3, batch_size=32)
    net = small_net()
    run = train_mil_model(net, train, {"valid": negatives}, tmp_path / "run", config)
    assert run.best_epoch == 3 and math.isnan(run.best["valid_auc"])
    assert run.best["valid_loss"] == run.curves["valid_loss"][-1]
    assert evaluate(net, negatives)["loss"] == pytest.approx(run.best["valid_loss"])


# --- the store of finished runs ----------------------------------------------------------------


@dataclass
class StoreConfig:
    size: int = 1
    names: tuple[str, ...] = ("a",)


def test_run_store_keeps_results_and_clears_stale_work(tmp_path: Path) -> None:
    ctx = RunContext(tmp_path)
    store = RunStore(ctx, StoreConfig())
    saved = json.loads((tmp_path / CHECKPOINT).read_text())  # at once: whose work it is
    assert saved == {
        "identity": {"config": {"size": 1, "names": ["a"]}, "stand_in_data": False},
        "processes": 1,
        "runs": {},
    }
    work = store.work_dir("elephant/dense/0/1")
    assert work == tmp_path / WORK_DIR / "elephant_dense_0_1"
    work.mkdir(parents=True)
    (work / "log.jsonl").write_text("{}")
    store.work_dir("other").mkdir()
    store.add("elephant/dense/0/1", {"auc": 0.5, "finished": True})
    assert not work.exists() and store.work_dir("other").exists()  # other runs are under way
    record = json.loads((tmp_path / CHECKPOINT).read_text())["runs"]["elephant/dense/0/1"]
    assert record == {"auc": 0.5, "finished": True, "processes": 1, "stop_after": None}
    same = RunStore(RunContext(tmp_path), StoreConfig())
    assert same["elephant/dense/0/1"]["auc"] == 0.5 and same.work_dir("other").exists()
    assert "elephant/dense/0/1" in same and "other" not in same
    same.add("other", {"auc": 0.25, "finished": True})
    assert not (tmp_path / WORK_DIR).exists()  # the empty work root goes too
    with pytest.raises(TypeError, match="finished"):
        same.add("third", {"auc": 0.25})
    store.work_dir("stale").mkdir(parents=True)
    assert "other" not in RunStore(RunContext(tmp_path, stand_in_data=True), StoreConfig())
    assert not (tmp_path / WORK_DIR).exists()  # another configuration's checkpoints are gone
    assert "other" not in RunStore(ctx, StoreConfig(size=2))


def test_run_store_reuses_a_cut_run_only_under_its_step_limit(tmp_path: Path) -> None:
    cut = RunStore(RunContext(tmp_path, stop_after=2), StoreConfig())
    cut.work_dir("a").mkdir(parents=True)
    cut.add("a", {"finished": False})
    assert cut.work_dir("a").is_dir()  # its checkpoint stays for a resume
    assert cut["a"]["stop_after"] == 2 and "a" in cut
    full = RunStore(RunContext(tmp_path), StoreConfig())
    assert "a" not in full and full.work_dir("a").is_dir()  # trained again, from the checkpoint
    full.add("a", {"finished": True})
    assert "a" in RunStore(RunContext(tmp_path, stop_after=2), StoreConfig())  # finished: kept
    assert "a" in RunStore(RunContext(tmp_path, stop_after=5), StoreConfig())


def test_run_store_clears_checkpoints_of_another_process_count(tmp_path: Path) -> None:
    store = RunStore(RunContext(tmp_path), StoreConfig())
    store.add("done", {"finished": True})
    record = json.loads((tmp_path / CHECKPOINT).read_text())
    (tmp_path / CHECKPOINT).write_text(json.dumps({**record, "processes": 2}))
    store.work_dir("half").mkdir(parents=True)
    again = RunStore(RunContext(tmp_path), StoreConfig())
    assert "done" in again and not store.work_dir("half").exists()
    assert json.loads((tmp_path / CHECKPOINT).read_text())["processes"] == 1


# --- experiments ---------------------------------------------------------------------------------


def test_mil_mnist_bags_tiny_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = run_experiment("mil-mnist-bags", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    table = record["results"]["tables"][0]
    assert table["columns"] == ["method", "M=5", "M=10"]
    assert [row[0] for row in table["rows"]] == ["dense", "sparse", "topk-50"]
    metrics = record["results"]["metrics"]
    assert all(0.0 <= v <= 1.0 for v in metrics.values()) and len(metrics) == 6
    saved = json.loads((path.parent / "runs.json").read_text())["runs"]
    assert len(saved["10/dense/0"]["curves"]["valid_accuracy"]) == 2  # curve at bag size 10

    def fail(task: Any) -> Any:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(mil_mnist_bags, "train_one", fail)
    again = json.loads(
        run_experiment("mil-mnist-bags", "tiny", tmp_path, progress=False).read_text()
    )
    assert again["results"]["metrics"] == metrics


def test_mil_mnist_bags_figures(tmp_path: Path) -> None:
    path = run_experiment(
        "mil-mnist-bags",
        "tiny",
        tmp_path,
        progress=False,
        overrides={
            "figures": "true",
            "bag_sizes": "[5]",
            "methods": '["dense"]',
            "curve_bag_size": "5",
        },
    )
    figures = json.loads(path.read_text())["results"]["figures"]
    assert figures == ["accuracy_vs_bag_size.png", "learning_curves.png"]
    assert all((path.parent / f).stat().st_size > 0 for f in figures)


def test_mil_benchmark_tiny(tmp_path: Path, shared_data: Path) -> None:
    path = run_experiment("mil-benchmark", "tiny", tmp_path, data_dir=shared_data, progress=False)
    record = json.loads(path.read_text())
    table = record["results"]["tables"][0]
    assert table["columns"] == ["method", "elephant (ours)", "elephant (paper)"]
    assert table["rows"][0][2] == 0.877 and table["rows"][1][2] == 0.852
    runs = json.loads((path.parent / "runs.json").read_text())["runs"]
    assert set(runs) == {f"elephant/{m}/0/{f}" for m in ("dense", "topk-50") for f in (0, 1)}


def test_mil_benchmark_missing_data(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="elephant"):
        run_experiment("mil-benchmark", "tiny", tmp_path / "out", data_dir=tmp_path, progress=False)


def test_mil_benchmark_stand_in_data(tmp_path: Path) -> None:
    path = run_experiment(
        "mil-benchmark",
        "tiny",
        tmp_path / "out",
        data_dir=tmp_path,
        progress=False,
        stand_in_data=True,
    )
    record = json.loads(path.read_text())
    assert any(
        "STAND-IN DATA" in note and "elephant" in note for note in record["results"]["notes"]
    )
    assert len(json.loads((path.parent / "runs.json").read_text())["runs"]) == 4


def test_mil_mnist_bags_stand_in_data(tmp_path: Path) -> None:
    overrides = {"source": "mnist", "bag_sizes": "[5]", "methods": '["dense"]'}
    with pytest.raises(DataNotFoundError, match="mnist"):
        run_experiment(
            "mil-mnist-bags", "tiny", tmp_path / "a", data_dir=tmp_path, overrides=overrides
        )
    path = run_experiment(
        "mil-mnist-bags",
        "tiny",
        tmp_path / "b",
        data_dir=tmp_path,
        progress=False,
        overrides=overrides,
        stand_in_data=True,
    )
    record = json.loads(path.read_text())
    assert any("STAND-IN DATA" in note for note in record["results"]["notes"])
    assert set(record["results"]["metrics"]) == {"accuracy/dense/5"}


def test_folds_are_stratified_and_disjoint() -> None:
    labels = np.array([1] * 26 + [0] * 32)
    config = replace(mil_benchmark.PRESETS["paper"], folds=10)
    splits = mil_benchmark.split_folds(labels, config, seed=0)
    tests = np.concatenate([s[2] for s in splits])
    assert sorted(tests.tolist()) == list(range(58))
    for train, valid, test in splits:
        assert not set(train) & set(valid) and not set(train) & set(test)
        assert len(train) + len(valid) + len(test) == 58
        assert 2 <= labels[test].sum() <= 3 and labels[valid].sum() >= 1
    assert all(
        np.array_equal(a[0], b[0])
        for a, b in zip(splits, mil_benchmark.split_folds(labels, config, 0), strict=True)
    )


def test_trials_come_from_the_search_space() -> None:
    config = replace(mil_benchmark.PRESETS["paper"], trials=30)
    trials = mil_benchmark.sample_trials(config, seed=0, fold=3)
    assert trials == mil_benchmark.sample_trials(config, seed=0, fold=3)
    assert trials != mil_benchmark.sample_trials(config, seed=0, fold=4)
    for name, field in mil_benchmark.SEARCH_SPACE.items():
        assert {t[name] for t in trials} <= set(getattr(config, field))
    assert len({t["width"] for t in trials}) == 3


def test_worker_processes() -> None:
    assert resolve_workers(1, 10) == 1 and resolve_workers(4, 2) == 2 and resolve_workers(0, 1) == 1
    with pytest.raises(ValueError, match="workers"):
        resolve_workers(-1, 3)
    results = dict(run_tasks(abs, [-1, -2, 3], workers=2))
    assert results == {-1: 1, -2: 2, 3: 3}


def test_no_worker_pools_under_several_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # a torchrun process: every process trains each run
    assert resolve_workers(4, 10) == 1 and resolve_workers(0, 10) == 1
    assert list(run_tasks(abs, [-2, -1, 3], workers=2)) == [(-2, 2), (-1, 1), (3, 3)]  # in order


def test_mil_bit_pattern_tiny(tmp_path: Path) -> None:
    path = run_experiment("mil-bit-pattern", "tiny", tmp_path, progress=False)
    record = json.loads(path.read_text())
    assert record["results"]["tables"][0]["rows"][1][0] == "sparse"
    assert set(record["results"]["metrics"]) == {"accuracy/dense/8", "accuracy/sparse/8"}
    assert not (path.parent / WORK_DIR).exists()  # finished runs leave no checkpoints


def test_a_stopped_experiment_resumes_from_trainer_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = run_experiment("mil-bit-pattern", "tiny", tmp_path / "reference", progress=False)
    out = tmp_path / "stopped"

    def stop(self: RunStore, key: str, value: Any) -> None:
        raise KeyboardInterrupt  # stopped after the first run's training, before its record

    with monkeypatch.context() as patch:
        patch.setattr(RunStore, "add", stop)
        with pytest.raises(KeyboardInterrupt):
            run_experiment("mil-bit-pattern", "tiny", out, progress=False)
    assert (out / "mil-bit-pattern" / WORK_DIR / "8_dense_0" / "checkpoints").is_dir()
    resumed: list[int | None] = []
    real = mil_bit_pattern.train_mil_model

    def recording(*args: Any) -> MILRun:
        result = real(*args)
        resumed.append(result.resumed_from)
        return result

    monkeypatch.setattr(mil_bit_pattern, "train_mil_model", recording)
    path = run_experiment("mil-bit-pattern", "tiny", out, progress=False)
    assert resumed == [8, None]  # dense: its final checkpoint (2 epochs × 4 steps); sparse: new
    metrics = json.loads(path.read_text())["results"]["metrics"]
    assert metrics == json.loads(reference.read_text())["results"]["metrics"]


def recording_trainer(
    monkeypatch: pytest.MonkeyPatch, module: Any, fail_at: int | None = None
) -> list[MILRun]:
    """Record every run ``module`` trains through ``train_mil_model``; with ``fail_at`` the run
    of that number (0-based) is interrupted after its training."""
    runs: list[MILRun] = []
    real = train_mil_model

    def recording(*args: Any) -> MILRun:
        result = real(*args)
        if len(runs) == fail_at:
            raise KeyboardInterrupt
        runs.append(result)
        return result

    monkeypatch.setattr(module, "train_mil_model", recording)
    return runs


def test_a_run_cut_by_max_steps_resumes_without_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = run_experiment("mil-bit-pattern", "tiny", tmp_path / "reference", progress=False)
    out = tmp_path / "cut"
    runs = recording_trainer(monkeypatch, mil_bit_pattern)
    run_experiment("mil-bit-pattern", "tiny", out, progress=False, stop_after=3)
    saved = json.loads((out / "mil-bit-pattern" / CHECKPOINT).read_text())["runs"]
    assert {k: (r["steps"], r["finished"], r["stop_after"]) for k, r in saved.items()} == {
        "8/dense/0": (3, False, 3),
        "8/sparse/0": (3, False, 3),
    }
    work = out / "mil-bit-pattern" / WORK_DIR
    assert [p.name for p in (work / "8_dense_0" / "checkpoints").iterdir()] == ["step-3"]
    run_experiment("mil-bit-pattern", "tiny", out, progress=False, stop_after=3)
    assert len(runs) == 2  # the same limit again: the records are reused
    path = run_experiment("mil-bit-pattern", "tiny", out, progress=False)
    assert [r.resumed_from for r in runs[2:]] == [3, 3] and all(r.finished for r in runs[2:])
    metrics = json.loads(path.read_text())["results"]["metrics"]
    assert metrics == json.loads(reference.read_text())["results"]["metrics"]
    assert not work.exists()  # finished: the checkpoints are gone
    run_experiment("mil-bit-pattern", "tiny", out, progress=False, stop_after=3)
    assert len(runs) == 4  # finished runs serve any limit


def test_a_stopped_fold_keeps_its_finished_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_data: Path
) -> None:
    options: dict[str, Any] = {
        "data_dir": shared_data,
        "progress": False,
        "overrides": {"methods": '["dense"]', "trials": "2"},
    }
    reference = run_experiment("mil-benchmark", "tiny", tmp_path / "reference", **options)
    out = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        recording_trainer(patch, mil_benchmark, fail_at=1)  # fold 0, trial 1
        with pytest.raises(KeyboardInterrupt):
            run_experiment("mil-benchmark", "tiny", out, **options)
    fold = out / "mil-benchmark" / WORK_DIR / "elephant_dense_0_0"
    assert (fold / "trial-0" / mil_benchmark.TRIAL_OUTCOME).is_file()
    assert not (fold / "trial-0" / "checkpoints").exists()
    assert (fold / "trial-1" / "checkpoints").is_dir()  # trained, but not recorded
    runs = recording_trainer(monkeypatch, mil_benchmark)
    path = run_experiment("mil-benchmark", "tiny", out, **options)
    # fold 0: trial 0 from its outcome, trial 1 from its final checkpoint; fold 1: both new
    assert [r.resumed_from for r in runs] == [10, None, None]  # 90 bags: 5 steps × 2 epochs
    saved = json.loads((path.parent / CHECKPOINT).read_text())["runs"]
    assert saved["elephant/dense/0/0"]["trial_steps"] == [10, 10]
    assert json.loads(path.read_text())["results"] == json.loads(reference.read_text())["results"]


def test_mean_pm_std() -> None:
    from hopfield.experiments.mil_common import mean_pm_std

    assert mean_pm_std([0.5]) == "0.500"
    assert mean_pm_std([0.4, 0.6]) == "0.500 ± 0.141"
    assert mean_pm_std([]) == "–"
