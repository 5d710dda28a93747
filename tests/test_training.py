"""hopfield.training: schedules, parameter groups, data order, monitoring, exact resume."""

from __future__ import annotations

import errno
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

pytest.importorskip("accelerate")

from hopfield.training import (
    BatchOrder,
    DiskFullError,
    MaxAbsMonitor,
    MicroBatchSampler,
    Trainer,
    TrainingConfig,
    latest_checkpoint,
    leave_process_group,
    lr_factor,
    micro_batch_layout,
    parameter_groups,
    read_log,
)

#: The trainer's own state in a checkpoint: accelerate's file of the second object registered for
#: checkpointing (the schedule is the first).
TRAINER_STATE = "custom_checkpoint_1.pkl"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(16, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.drop(torch.relu(self.norm(self.inp(x)))))


def data(n: int = 40) -> list[tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(1, keepdim=True)
    return list(zip(x, y, strict=True))


def loss_fn(model: nn.Module, batch: Any) -> Tensor:
    x, y = batch
    noise = 0.1 * torch.randn_like(x)  # global RNG inside the loss, as MLM masking does
    return ((model(x + noise) - y) ** 2).mean()


def config(**kw: Any) -> TrainingConfig:
    base: dict[str, Any] = dict(
        max_steps=8,
        batch_size=8,
        micro_batch_size=4,
        lr=1e-2,
        warmup_steps=2,
        checkpoint_every=3,
        log_every=2,
        cpu=True,
    )
    return TrainingConfig(**{**base, **kw})


def trainer(out: Path, **kw: Any) -> Trainer:
    torch.manual_seed(0)
    evaluate = kw.pop("evaluate", None)
    return Trainer(
        Net(),
        data(),
        loss_fn,
        config(**kw),
        out,
        monitor=[r"inp", r"norm"],
        evaluate=evaluate,
        progress=False,
    )


def test_lr_factor_schedules() -> None:
    lin = TrainingConfig(max_steps=10, warmup_steps=4, schedule="linear")
    assert [lr_factor(s, lin) for s in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert lr_factor(4, lin) == 1.0 and lr_factor(7, lin) == pytest.approx(0.5)
    assert lr_factor(10, lin) == 0.0 and lr_factor(50, lin) == 0.0
    cos = TrainingConfig(
        max_steps=12, warmup_steps=2, schedule="cosine", min_lr_ratio=0.01, warmup_start_ratio=0.1
    )
    assert lr_factor(0, cos) == pytest.approx(0.1) and lr_factor(1, cos) == pytest.approx(0.55)
    assert lr_factor(7, cos) == pytest.approx(0.01 + 0.99 * 0.5)
    assert lr_factor(12, cos) == pytest.approx(0.01)
    const = TrainingConfig(max_steps=5, warmup_steps=1, schedule="constant")
    assert lr_factor(0, const) == 0.0 and lr_factor(4, const) == 1.0
    with pytest.raises(ValueError, match="step"):
        lr_factor(-1, lin)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_steps", 0),
        ("batch_size", 0),
        ("micro_batch_size", 1.5),
        ("stop_after", 0),
        ("log_every", "week"),
        ("eval_every", -1),
        ("optimizer", "lion"),
        ("select_mode", "up"),
        ("patience", -2),
        ("schedule", "step"),
        ("mixed_precision", "fp8"),
        ("lr", 0.0),
        ("warmup_steps", -1),
        ("min_lr_ratio", 2.0),
    ],
)
def test_config_validation(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        TrainingConfig(**{"max_steps": 3, field: value})


def test_parameter_groups_skip_bias_and_norm() -> None:
    net = Net()
    decay, plain = parameter_groups(net, 0.1)
    assert {id(p) for p in decay["params"]} == {id(net.inp.weight), id(net.out.weight)}
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 4
    decay, plain = parameter_groups(net, 0.1, decay_norm_weights=True)
    assert id(net.norm.weight) in {id(p) for p in decay["params"]}
    assert {id(p) for p in plain["params"]} == {
        id(net.inp.bias),
        id(net.norm.bias),
        id(net.out.bias),
    }


def test_batch_order_is_a_function_of_seed_and_epoch() -> None:
    order = BatchOrder(10, 3, seed=5)
    assert order.per_epoch == 3 and order.accumulation == 1
    epoch0 = [order.indices(m) for m in range(3)]
    flat = [i for batch in epoch0 for i in batch]
    assert len(set(flat)) == 9 and all(len(b) == 3 for b in epoch0)
    epoch1 = [order.indices(m) for m in range(3, 6)]
    assert epoch1 != epoch0
    again = BatchOrder(10, 3, seed=5)
    assert again.indices(4) == epoch1[1] and again.indices(0) == epoch0[0]  # random access
    with pytest.raises(ValueError, match="global batch"):
        BatchOrder(3, 4)
    with pytest.raises(ValueError, match="rank"):
        BatchOrder(10, 2, processes=2, rank=2)
    uneven = BatchOrder(12, 6, micro_batch_size=4)  # 4 does not divide 6: the largest that does
    assert uneven.micro_batch_size == 3 and uneven.accumulation == 2
    with pytest.raises(ValueError, match="micro"):
        order.indices(0, micro=1)


@pytest.mark.parametrize(("processes", "micro"), [(1, 2), (2, 1), (2, 2), (2, None), (4, 1)])
def test_a_step_trains_on_the_same_examples_for_every_process_layout(
    processes: int, micro: int | None
) -> None:
    one = BatchOrder(24, 4, seed=1)
    layout = [
        BatchOrder(24, 4, micro, seed=1, processes=processes, rank=r) for r in range(processes)
    ]
    for step in range(12):  # two epochs
        examples = [
            i for order in layout for k in range(order.accumulation) for i in order.indices(step, k)
        ]
        assert sorted(examples) == sorted(one.indices(step))


def test_max_abs_monitor_records_only_while_active() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    monitor = MaxAbsMonitor(net, [r"\d"])
    assert monitor.names == ["0", "1"]
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    net(x)
    monitor.start()
    net(x)
    net(2 * x)
    values = monitor.collect()
    lin = net[0](2 * x).detach()
    assert values["0"] == pytest.approx(float(lin.abs().max()))
    assert values["1"] == pytest.approx(float(lin.clamp_min(0).max()))
    net(10 * x)
    assert monitor.collect() == {}
    monitor.remove()
    with pytest.raises(ValueError, match="patterns"):
        MaxAbsMonitor(net, ["nothing"])
    with pytest.raises(TypeError, match="patterns"):
        MaxAbsMonitor(net, "0")


def test_training_reduces_loss_and_logs(tmp_path: Path) -> None:
    run = trainer(
        tmp_path, max_steps=30, log_every=5, checkpoint_every=0, evaluate=lambda m: {"x": 1.0}
    )
    result = run.fit()
    assert result.finished and result.step == 30 and result.resumed_from is None
    log = read_log(tmp_path)
    assert log == result.log and [r["step"] for r in log] == [5, 10, 15, 20, 25, 30]
    assert log[-1]["loss"] < 0.5 * log[0]["loss"]
    assert set(log[0]["max_abs"]) == {"inp", "norm"} and all(
        v > 0 for v in log[0]["max_abs"].values()
    )
    assert "eval" not in log[0] and log[-1]["eval"] == {"x": 1.0}
    assert log[0]["lr"] == pytest.approx(1e-2 * lr_factor(4, run.config))
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-30"


class Crash(RuntimeError):
    pass


def test_stopped_and_resumed_run_is_bitwise_identical(tmp_path: Path) -> None:
    calls = {"n": 0}

    def evaluate(model: nn.Module) -> dict[str, float]:
        torch.randn(5)  # evaluation randomness must not leak into training
        return {"w": float(model.out.weight.sum())}

    full = trainer(tmp_path / "full", evaluate=evaluate, eval_every=4)
    reference = full.fit()
    reference_state = {k: v.clone() for k, v in full.model.state_dict().items()}

    # a crash during step 5 (after the checkpoint of step 3), then a fresh process resumes
    crashing = trainer(tmp_path / "cut", evaluate=evaluate, eval_every=4)

    def crash_at_step_5(model: nn.Module, batch: Any) -> Tensor:
        calls["n"] += 1
        if calls["n"] > 8:  # 4 steps x 2 micro-batches done
            raise Crash
        return loss_fn(model, batch)

    crashing.loss_fn = crash_at_step_5
    with pytest.raises(Crash):
        crashing.fit()
    assert latest_checkpoint(tmp_path / "cut").name == "step-3"
    torch.manual_seed(123)  # the new process's RNG differs; the checkpoint restores it
    resumed = trainer(tmp_path / "cut", evaluate=evaluate, eval_every=4)
    result = resumed.fit()
    assert result.resumed_from == 3 and result.step == 8
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, reference_state[name]), name
    assert result.log == reference.log
    assert (tmp_path / "cut" / "log.jsonl").read_text() == (
        tmp_path / "full" / "log.jsonl"
    ).read_text()
    assert [r["step"] for r in result.log] == [2, 4, 6, 8]
    assert "eval" in result.log[1] and "eval" not in result.log[2]


def test_until_step_splits_a_run(tmp_path: Path) -> None:
    full = trainer(tmp_path / "full", checkpoint_every=0)
    full.fit()
    part = trainer(tmp_path / "part", checkpoint_every=0, keep_checkpoints=2)
    first = part.fit(until_step=5)
    assert not first.finished and first.step == 5
    second = trainer(tmp_path / "part", checkpoint_every=0, keep_checkpoints=2).fit()
    assert second.resumed_from == 5 and second.finished
    assert json.dumps(second.log) == json.dumps(full.log)
    steps = sorted(p.name for p in (tmp_path / "part" / "checkpoints").iterdir())
    assert steps == ["step-5", "step-8"]
    # resume=False starts over and overwrites the log
    again = trainer(tmp_path / "part", checkpoint_every=0).fit(resume=False, until_step=3)
    assert again.resumed_from is None and again.log == full.log[:1]
    assert latest_checkpoint(tmp_path / "part").name == "step-3"  # the older step-8 is gone


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="model"):
        Trainer("net", data(), loss_fn, config(), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        Trainer(Net(), data(), loss_fn, {"max_steps": 1}, tmp_path)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dataset"):
        Trainer(Net(), iter(data()), loss_fn, config(), tmp_path)
    bad = Trainer(Net(), data(), lambda m, b: torch.ones(2), config(), tmp_path, progress=False)
    with pytest.raises(TypeError, match="scalar"):
        bad.fit()


def test_no_clipping_reports_the_gradient_norm(tmp_path: Path) -> None:
    result = trainer(tmp_path, grad_clip=None, max_steps=2, log_every=1).fit()
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in result.log)


def test_bf16_mixed_precision_in_a_fresh_process(tmp_path: Path) -> None:
    """accelerate keeps one precision per process, so this runs in a subprocess."""
    import subprocess
    import sys

    script = f"""
import torch
from torch import nn
from hopfield.training import Trainer, TrainingConfig
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
data = [(x, x.sum(0, keepdim=True)) for x in torch.randn(64, 4)]
def loss_fn(model, batch):
    x, y = batch
    inner = model[0](x)
    assert inner.dtype == torch.bfloat16, inner.dtype
    return ((model(x).float() - y) ** 2).mean()
config = TrainingConfig(max_steps=4, batch_size=8, lr=1e-2, mixed_precision="bf16", cpu=True,
                        log_every=2)
result = Trainer(model, data, loss_fn, config, {str(tmp_path)!r}, progress=False).fit()
assert result.finished and all(torch.isfinite(torch.tensor(r["loss"])) for r in result.log)
assert next(model.parameters()).dtype == torch.float32  # master weights stay float32
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
    # its checkpoint is not resumed at another precision
    with pytest.raises(ValueError, match="mixed_precision='bf16'"):
        trainer(tmp_path).fit()


def test_epochs_evaluation_periods_and_training_metrics(tmp_path: Path) -> None:
    def loss_and_metric(model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        x, y = batch
        error = model(x) - y
        return (error**2).mean(), {"mae": error.abs().mean()}

    torch.manual_seed(0)
    cfg = TrainingConfig(
        epochs=3, batch_size=8, lr=1e-2, log_every="epoch", eval_every="epoch", cpu=True
    )
    run = Trainer(
        Net(),
        data(),
        loss_and_metric,
        cfg,
        tmp_path,
        progress=False,
        evaluate=lambda m: {"one": 1.0},
    )
    assert run.steps_per_epoch == 5 and run.total_steps == 15
    result = run.fit()
    assert [r["step"] for r in result.log] == [5, 10, 15]
    assert [r["epoch"] for r in result.log] == [0, 1, 2]
    assert all("eval" in r and r["mae"] > 0 for r in result.log)
    assert result.processes == 1 and result.best_step is None and result.best == {}


def test_early_stopping_restores_the_best_weights(tmp_path: Path) -> None:
    scores = iter([5.0, 3.0, 4.0, 3.0, 1.0])  # best at the 2nd evaluation, then 2 without gain
    snapshots: list[Tensor] = []

    def evaluate(model: nn.Module) -> dict[str, float]:
        snapshots.append(model.out.weight.detach().clone())
        return {"val": next(scores)}

    run = trainer(
        tmp_path, max_steps=10, eval_every=2, select_metric="val", patience=2, evaluate=evaluate
    )
    result = run.fit()
    assert result.stopped_early and result.finished and result.step == 8
    assert result.best_step == 4 and result.best == {"val": 3.0}
    assert result.log[-1]["stopped_early"] is True
    # the weights restored are those evaluated at step 4, not those of step 8
    assert len(snapshots) == 4
    assert latest_checkpoint(tmp_path).name == "step-8"
    state = torch.load(latest_checkpoint(tmp_path) / TRAINER_STATE, weights_only=False)
    assert torch.equal(state["best_state"]["out.weight"], snapshots[1])
    assert torch.equal(run.unwrapped.out.weight, snapshots[1])


def test_early_stopping_resumes_with_its_counters(tmp_path: Path) -> None:
    def evaluate(model: nn.Module) -> dict[str, float]:
        return {"val": float(model.out.weight.abs().sum())}

    common: dict[str, Any] = dict(
        max_steps=12,
        eval_every=2,
        select_metric="val",
        select_mode="max",
        patience=3,
        checkpoint_every=2,
    )
    full = trainer(tmp_path / "full", evaluate=evaluate, **common)
    reference = full.fit()
    part = trainer(tmp_path / "part", evaluate=evaluate, **common)
    part.fit(until_step=6)
    resumed = trainer(tmp_path / "part", evaluate=evaluate, **common)
    result = resumed.fit()
    assert result.resumed_from == 6
    assert (result.best_step, result.best, result.step) == (
        reference.best_step,
        reference.best,
        reference.step,
    )
    for name, value in resumed.unwrapped.state_dict().items():
        assert torch.equal(value, full.unwrapped.state_dict()[name]), name


def test_select_metric_must_be_evaluated(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_steps=2, select_metric="val", evaluate=lambda m: {"x": 1.0})
    with pytest.raises(KeyError, match="val"):
        run.fit()
    with pytest.raises(ValueError, match="patience"):
        TrainingConfig(max_steps=2, patience=1)
    with pytest.raises(ValueError, match="exactly one"):
        TrainingConfig(max_steps=2, epochs=1)


def test_schedule_callable_optimizer_choice_and_stop_after(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = TrainingConfig(
        max_steps=6,
        batch_size=8,
        lr=0.5,
        optimizer="adam",
        weight_decay=0.1,
        log_every=1,
        stop_after=4,
        cpu=True,
    )
    run = Trainer(
        Net(), data(), loss_fn, cfg, tmp_path, progress=False, schedule=lambda step: 0.5**step
    )
    assert isinstance(run.optimizer.optimizer, torch.optim.Adam) and not isinstance(
        run.optimizer.optimizer, torch.optim.AdamW
    )
    result = run.fit()
    assert [r["lr"] for r in result.log] == [0.5, 0.25, 0.125, 0.0625]
    assert result.step == 4 and not result.finished


def test_leave_process_group_does_nothing_in_one_process() -> None:
    # a single process has no group to leave, and must not be ended (os._exit) by the call
    assert not torch.distributed.is_initialized()
    assert leave_process_group(exit_status=3) is None


def _cut_at_step_6(out: Path) -> Path:
    """A run stopped after step 6; returns its newest checkpoint (step 3 is kept beside it)."""
    trainer(out).fit(until_step=6)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-6"]
    return out / "checkpoints" / "step-6"


DAMAGES = {
    "half the weights": ("model.safetensors", lambda b: b[: len(b) // 2]),
    "empty RNG states": ("random_states_0.pkl", lambda b: b""),
    "one byte changed": ("optimizer.bin", lambda b: b[:-9] + bytes([b[-9] ^ 1]) + b[-8:]),
    "a manifest cut short": ("manifest.json", lambda b: b[:40]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_falls_back_to_the_one_before(tmp_path: Path, damage: str) -> None:
    reference = trainer(tmp_path / "full").fit()
    newest = _cut_at_step_6(tmp_path / "cut")
    name, change = DAMAGES[damage]
    bad = newest / name
    bad.write_bytes(change(bad.read_bytes()))
    fresh = trainer(tmp_path / "cut")
    before = {k: v.clone() for k, v in fresh.unwrapped.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(f"damaged checkpoint {bad}")):
        fresh.load_checkpoint(newest)
    for key, value in fresh.unwrapped.state_dict().items():  # nothing was loaded
        assert torch.equal(value, before[key]), key
    with pytest.warns(UserWarning, match=re.escape(f"damaged checkpoint {bad}")) as caught:
        result = trainer(tmp_path / "cut").fit()
    assert len(caught) == 1
    assert result.resumed_from == 3 and result.finished
    assert json.dumps(result.log) == json.dumps(reference.log)


def test_a_file_the_manifest_does_not_list_makes_a_checkpoint_damaged(tmp_path: Path) -> None:
    newest = _cut_at_step_6(tmp_path / "cut")
    (newest / "custom_checkpoint_9.pkl").write_bytes(b"planted")
    with pytest.raises(ValueError, match=r"custom_checkpoint_9\.pkl: not in the manifest"):
        trainer(tmp_path / "cut").load_checkpoint(newest)


def test_no_readable_checkpoint_starts_over(tmp_path: Path) -> None:
    reference = trainer(tmp_path / "full").fit()
    newest = _cut_at_step_6(tmp_path / "cut")
    for folder in (newest, newest.parent / "step-3"):
        (folder / "manifest.json").write_bytes(b"not a manifest")
    with pytest.warns(UserWarning, match="damaged checkpoint") as caught:
        result = trainer(tmp_path / "cut").fit()
    assert len(caught) == 2
    assert result.resumed_from is None and result.finished
    assert json.dumps(result.log) == json.dumps(reference.log)


def test_a_checkpoint_of_another_step_is_not_trusted(tmp_path: Path) -> None:
    newest = _cut_at_step_6(tmp_path / "cut")
    shutil.rmtree(newest)
    shutil.copytree(newest.parent / "step-3", newest)
    with pytest.warns(UserWarning, match="holds step 3, not 6"):
        assert trainer(tmp_path / "cut").fit().resumed_from == 3


def test_a_checkpoint_of_the_old_format_is_named_not_deleted(tmp_path: Path) -> None:
    old = tmp_path / "checkpoints" / "step-4"
    old.mkdir(parents=True)
    (old / "trainer.pt").write_bytes(b"an older hopfield's checkpoint")
    with pytest.raises(ValueError, match=re.escape(f"checkpoint {old} was written by hopfield")):
        trainer(tmp_path).fit()
    assert (old / "trainer.pt").is_file()


def _no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_one_error_naming_the_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = trainer(tmp_path, max_steps=8, checkpoint_every=3)
    run.fit(until_step=3)
    real_save = torch.save

    def save_until_full(obj: Any, file: Any) -> None:
        real_save(obj, file)
        _no_space()

    monkeypatch.setattr(torch, "save", save_until_full)
    with pytest.raises(DiskFullError, match=r"no space left on the device to write .*step-6"):
        trainer(tmp_path, max_steps=8, checkpoint_every=3).fit()
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step-3"]  # the earlier checkpoint is kept, no tmp-step-6 folder
    monkeypatch.setattr(Path, "write_text", _no_space)
    with pytest.raises(DiskFullError, match=r"log\.jsonl"):
        run._write_log()
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_failed_write_on_a_full_disk_without_errno_is_a_disk_full_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``torch.save`` given a path reports ENOSPC as a bare ``RuntimeError``; with less than
    1 MiB left on the file system that failure is read as a full disk."""
    run = trainer(tmp_path, max_steps=8, checkpoint_every=3)

    def failing_save(obj: Any, file: Any) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc] PytorchStreamWriter failed")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):  # space left: not a full disk
        run.fit(until_step=3)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 0))
    with pytest.raises(DiskFullError, match=r"no space left on the device to write .*step-3"):
        trainer(tmp_path, max_steps=8, checkpoint_every=3).fit(until_step=3)
    assert not list((tmp_path / "checkpoints").iterdir())


def test_betas_and_eps_are_checked() -> None:
    for betas in [(1.5, 0.9), (0.9, 1.0), (-0.1, 0.9), (0.9,), "ab"]:
        with pytest.raises(ValueError, match="betas must be two numbers in"):
            config(betas=betas)
    with pytest.raises(ValueError, match="eps must be positive"):
        config(eps=0.0)
    assert config(betas=[0, 0.5]).betas == (0.0, 0.5)


@pytest.mark.parametrize(
    ("batch", "micro", "processes", "expected"),
    [
        (192, 24, 16, 12),  # OPT paper preset on 2 x 8 GPUs: 12 a process, no accumulation
        (256, 32, 16, 16),  # BERT
        (5120, 128, 16, 80),  # ViT: 320 a process, 4 micro-batches of 80
        (192, 24, 8, 24),  # the preset's own layout is kept
        (192, None, 3, 64),
    ],
)
def test_any_process_count_that_divides_the_batch_keeps_it(
    batch: int, micro: int | None, processes: int, expected: int
) -> None:
    assert micro_batch_layout(batch, micro, processes) == expected
    order = BatchOrder(batch * 2, batch, micro, processes=processes, rank=processes - 1)
    assert order.micro_batch_size * order.accumulation * processes == batch


def test_a_process_count_that_cannot_split_the_batch_names_those_that_can() -> None:
    with pytest.raises(ValueError, match=r"over 8 processes; process counts that can: 1, 2, 4"):
        micro_batch_layout(4, None, 8)  # the mil-benchmark failure (micro-batch 0)
    with pytest.raises(ValueError, match="1, 2, 3, 6"):
        micro_batch_layout(6, 2, 4)


class Reading:
    """A dataset whose reads happen where the DataLoader runs them (workers or here)."""

    def __init__(self) -> None:
        self.examples = data()

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Any:
        return self.examples[i]


def test_data_workers_feed_the_same_steps_and_resume_exactly(tmp_path: Path) -> None:
    """Two DataLoader workers give bitwise the weights and log of reading in the step, and a
    run stopped with workers resumes to the same end (the sampler starts at the resumed step)."""

    def run(out: Path, workers: int, until: int | None = None) -> Trainer:
        torch.manual_seed(0)
        cfg = config(num_workers=workers, checkpoint_every=3)
        job = Trainer(Net(), Reading(), loss_fn, cfg, out, progress=False)
        job.fit(until_step=until)
        return job

    inline, threaded = run(tmp_path / "inline", 0), run(tmp_path / "workers", 2)
    for name, value in threaded.model.state_dict().items():
        assert torch.equal(value, inline.model.state_dict()[name]), name
    assert read_log(tmp_path / "workers") == read_log(tmp_path / "inline")
    run(tmp_path / "cut", 2, until=5)
    resumed = run(tmp_path / "cut", 2)
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, inline.model.state_dict()[name]), name
    with pytest.raises(ValueError, match="num_workers"):
        TrainingConfig(max_steps=1, num_workers=-1)


def test_the_micro_batch_sampler_follows_the_batch_order() -> None:
    order = BatchOrder(24, 8, micro_batch_size=2, seed=3, processes=2, rank=1)
    sampler = MicroBatchSampler(order, 1, 3)
    expected = [order.indices(s, m) for s in (1, 2) for m in range(order.accumulation)]
    assert list(sampler) == expected and len(sampler) == 4
    with pytest.raises(ValueError, match="start"):
        MicroBatchSampler(order, 3, 1)


def test_a_runs_data_workers_reach_every_training_config(tmp_path: Path) -> None:
    from hopfield.cli import main
    from hopfield.experiments.results import RunContext

    ctx = RunContext(tmp_path, data_workers=3)
    assert ctx.training_config(max_steps=1).num_workers == 3
    assert ctx.training_config(max_steps=1, num_workers=1).num_workers == 1  # an experiment's own
    with pytest.raises(SystemExit):
        main(["run", "retrieval-demo", "--preset", "tiny", "--data-workers", "-1"])


def _masked_run(out: Path, micro: int, count: bool) -> tuple[list[dict[str, Any]], Tensor]:
    """Regression on a varying number of kept outputs per example (the first ``k`` of 6,
    ``k`` = 1..6): the loss is the mean over a micro-batch's kept outputs."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, 4, generator=g)
    examples = [(x[i], x[i].sum().repeat(6), torch.arange(6) < 1 + i % 6) for i in range(24)]

    def masked_loss(model: nn.Module, batch: Any) -> Tensor:
        inputs, targets, keep = batch
        error = (model(inputs) - targets) ** 2
        return error[keep].mean()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 6))
    settings = dict(max_steps=6, batch_size=12, micro_batch_size=micro, log_every=1)
    result = Trainer(
        model,
        examples,
        masked_loss,
        config(**settings, grad_clip=None),
        out,
        count_fn=(lambda batch: batch[2].sum()) if count else None,
        progress=False,
    ).fit()
    return result.log, model[2].weight.detach().clone()


def test_count_fn_makes_accumulated_masked_losses_the_global_mean(tmp_path: Path) -> None:
    """With ``count_fn``, micro-batches of 3 accumulated 4 times train and log what one
    micro-batch of 12 does (the mean over every kept output of the step); without it, the mean
    of the 4 micro-batch means weighs the outputs differently (the positive control)."""
    whole_log, whole = _masked_run(tmp_path / "whole", 12, count=True)
    plain_log, plain = _masked_run(tmp_path / "plain", 12, count=False)
    assert torch.equal(plain, whole)
    assert json.dumps(whole_log) == json.dumps(plain_log)  # one micro-batch: weight 1, the same
    counted_log, counted = _masked_run(tmp_path / "counted", 3, count=True)
    for a, b in zip(whole_log, counted_log, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    torch.testing.assert_close(counted, whole, rtol=1e-5, atol=1e-6)
    _, uncounted = _masked_run(tmp_path / "uncounted", 3, count=False)
    assert not torch.allclose(uncounted, whole, rtol=1e-4, atol=1e-5)


class _RedrawnFeatures(nn.Module):
    """A Hopfield pooling over random features redrawn at every call, and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        from hopfield.functional import RandomFeatures
        from hopfield.nn import HopfieldPooling

        features = RandomFeatures(4, redraw=1)
        self.pool = HopfieldPooling(4, num_heads=2, structure=features, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.pool(x.unsqueeze(1).expand(-1, 3, -1)).squeeze(1))


def _squared_error(model: nn.Module, batch: Any) -> Tensor:
    x, y = batch
    return (model(x) - y).square().mean()


def test_a_run_with_redrawn_random_features_resumes_bitwise(tmp_path: Path) -> None:
    """Random features redrawn at every call: the redraws follow from the first seed and the
    count of draws, which the checkpoint's state dict keeps, so a stopped and resumed run ends
    with the uninterrupted run's projection and weights. Before 29 Nov the resumed run restarted
    its redraw count and drew from its new process's stream."""

    def run(out: Path, until: int | None, resume: bool) -> nn.Module:
        torch.manual_seed(0)
        config = TrainingConfig(max_steps=6, batch_size=8, lr=1e-2, checkpoint_every=1, cpu=True)
        model = _RedrawnFeatures()
        job = Trainer(model, data(), _squared_error, config, out, progress=False)
        job.fit(until_step=until, resume=resume)
        return job.unwrapped

    whole = run(tmp_path / "whole", None, False)
    run(tmp_path / "parts", 3, False)
    resumed = run(tmp_path / "parts", None, True)  # a new job, built as the first was
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, whole.state_dict()[name]), name


class _EntmaxPooling(nn.Module):
    """A Hopfield pooling with a learnable entmax alpha, and a linear head; ``scalar_alpha``
    keeps the alpha's logit 0-d, as this package did before 29 Nov 2026."""

    def __init__(self, scalar_alpha: bool) -> None:
        super().__init__()
        from hopfield.functional import Entmax
        from hopfield.nn import HopfieldPooling

        separation = Entmax(1.5, learnable=True)
        if scalar_alpha:
            assert separation.alpha_logit is not None
            separation.alpha_logit = nn.Parameter(separation.alpha_logit.detach().reshape(()))
        self.pool = HopfieldPooling(4, num_heads=2, separation=separation, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, x: Tensor) -> Tensor:
        patterns = torch.stack([x, x.roll(1, -1), -x], 1)  # distinct: alpha gets a gradient
        return self.out(self.pool(patterns).squeeze(1))


def test_a_checkpoint_with_zero_dimensional_scalars_resumes(tmp_path: Path) -> None:
    """A run checkpointed while learnable scalars were 0-d parameters (their Adam moments 0-d
    too) resumes with the one-element parameters and ends where the uninterrupted old run does
    (the first step after resuming failed: the moments could not take the gradient's shape)."""

    def run(out: Path, until: int | None, resume: bool, scalar_alpha: bool) -> nn.Module:
        torch.manual_seed(0)
        config = TrainingConfig(max_steps=6, batch_size=8, lr=1e-2, checkpoint_every=1, cpu=True)
        job = Trainer(
            _EntmaxPooling(scalar_alpha), data(), _squared_error, config, out, progress=False
        )
        job.fit(until_step=until, resume=resume)
        return job.unwrapped

    whole = run(tmp_path / "whole", None, False, scalar_alpha=True).state_dict()
    run(tmp_path / "parts", 3, False, scalar_alpha=True)
    resumed = run(tmp_path / "parts", None, True, scalar_alpha=False).state_dict()
    assert resumed["pool.hopfield.separation.alpha_logit"].shape == (1,)
    for name, value in resumed.items():
        torch.testing.assert_close(value, whole[name].reshape(value.shape), rtol=0, atol=0)
    assert not torch.equal(resumed["pool.hopfield.separation.alpha_logit"], torch.zeros(1))
