"""The training engine under two and three processes (torchrun, gloo): the same loss curve as
one process with the same global batch, and a stopped-and-resumed run that ends where an
uninterrupted one does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from launch import torchrun

SCRIPT = str(Path(__file__).with_name("distributed_training_script.py"))


def _result(out: Path) -> dict[str, Any]:
    return json.loads((out / "result.json").read_text())


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two")
    torchrun([SCRIPT, str(out), "4"], cwd=out)
    return out


def test_two_processes_follow_the_one_process_loss_curve(
    two_processes: Path, tmp_path: Path
) -> None:
    one = tmp_path / "one"
    one.mkdir()
    done = subprocess.run(
        [sys.executable, SCRIPT, str(one), "8"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    single, double = _result(one), _result(two_processes)
    assert single["processes"] == 1 and double["processes"] == 2
    assert single["step"] == double["step"] == 12  # 3 epochs × 64 / 16
    assert [r["step"] for r in double["log"]] == list(range(1, 13))
    for a, b in zip(single["log"], double["log"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["mae"] == pytest.approx(a["mae"], rel=1e-5, abs=1e-7)
        assert b["lr"] == a["lr"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["max_abs"]["1"] == pytest.approx(a["max_abs"]["1"], rel=1e-5)
        if "eval" in a:
            assert b["eval"]["probe"] == pytest.approx(a["eval"]["probe"], rel=1e-5, abs=1e-6)
    # the processes draw different dropout/masks; the first keeps the 1-process stream
    (first,), (second,) = double["first_draws"]
    assert first == single["first_draws"][0][0] and second != first
    w1, w2 = _weights(one), _weights(two_processes)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-6)


def test_a_stopped_two_process_run_resumes_to_the_same_weights(
    two_processes: Path, tmp_path: Path
) -> None:
    torchrun([SCRIPT, str(tmp_path), "4", "5"], cwd=tmp_path)  # stops after step 5
    first = _result(tmp_path)
    assert first["step"] == 5 and first["processes"] == 2
    torchrun([SCRIPT, str(tmp_path), "4"], cwd=tmp_path)  # a new job resumes
    resumed = _result(tmp_path)
    assert resumed["resumed_from"] == 5 and resumed["step"] == 12
    assert resumed["log"] == _result(two_processes)["log"]
    reference = _weights(two_processes)
    for name, value in _weights(tmp_path).items():
        assert torch.equal(value, reference[name]), name


def test_a_resumed_two_process_run_logs_the_interrupted_interval_as_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """Logging every 4 steps and stopping after step 5 leaves step 5's loss in every process's
    running sums; each process keeps its own in the checkpoint, so the record of steps 5-8
    is the uninterrupted run's (with only the main process's sums, it was not)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    torchrun([SCRIPT, str(whole), "4", "-", "4"], cwd=whole)
    torchrun([SCRIPT, str(parts), "4", "5", "4"], cwd=parts)
    torchrun([SCRIPT, str(parts), "4", "-", "4"], cwd=parts)
    resumed, uninterrupted = _result(parts), _result(whole)
    assert resumed["resumed_from"] == 5
    assert [r["step"] for r in resumed["log"]] == [4, 8, 12]
    for a, b in zip(uninterrupted["log"], resumed["log"], strict=True):
        assert b["loss"] == a["loss"] and b["mae"] == a["mae"], (a["step"], b["step"])


def _one_process(out: Path, *args: str) -> dict[str, Any]:
    out.mkdir()
    done = subprocess.run(
        [sys.executable, SCRIPT, str(out), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _result(out)


def test_three_processes_follow_one_and_resume_to_float_rounding(tmp_path: Path) -> None:
    """A global batch of 12 over 3 processes with micro-batches of 2 (2 accumulated each): the
    loss curve of one process with the same batch; stopped after step 7 and resumed, the
    weights and the log of the uninterrupted 3-process run to float rounding (not bitwise: a
    resumed job's new process group may add the three processes' gradients in another order;
    uninterrupted 3-process runs repeat each other bitwise)."""
    single = _one_process(tmp_path / "one", "12", "-", "1", "12")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    torchrun([SCRIPT, str(whole), "2", "-", "1", "12"], cwd=whole, nproc=3)
    torchrun([SCRIPT, str(parts), "2", "7", "1", "12"], cwd=parts, nproc=3)
    torchrun([SCRIPT, str(parts), "2", "-", "1", "12"], cwd=parts, nproc=3)
    triple, resumed = _result(whole), _result(parts)
    assert triple["processes"] == 3 and triple["step"] == single["step"] == 15  # 3 × 64 // 12
    for a, b in zip(single["log"], triple["log"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["lr"] == a["lr"]
        assert b["max_abs"]["1"] == pytest.approx(a["max_abs"]["1"], rel=1e-5)
    assert len({draw for (draw,) in triple["first_draws"]}) == 3  # each process its own stream
    assert resumed["resumed_from"] == 7
    assert [r["step"] for r in resumed["log"]] == list(range(1, 16))
    for a, b in zip(triple["log"], resumed["log"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6), a["step"]
        assert b.get("eval", {}).get("probe") == pytest.approx(a.get("eval", {}).get("probe"))
    reference = _weights(whole)
    for name, value in _weights(parts).items():
        torch.testing.assert_close(value, reference[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("redraw", [None, 1])
def test_a_random_feature_projection_is_the_same_on_every_process(
    tmp_path: Path, redraw: int | None
) -> None:
    """A layer draws its random-feature projection when it is built, before the trainer gives
    each process its own random stream and before the model is wrapped, which broadcasts it; a
    redraw follows from the first draw's seed and the count of draws, not from the process's
    stream: every process's every call uses the same projection (with ``redraw=1`` a new one
    each call). Before 29 Nov the projection was drawn at the first call from each process's own
    stream (the second process computed its first micro-batch with another projection), and so
    was every redraw."""
    script = str(Path(__file__).with_name("distributed_projection_script.py"))
    torchrun([script, str(tmp_path), *([] if redraw is None else [str(redraw)])], cwd=tmp_path)
    first, second = json.loads((tmp_path / "projections.json").read_text())
    assert len(first) == 2 and first == second
    assert (first[0] == first[1]) == (redraw is None)


def test_the_layers_train_under_fsdp2_as_in_one_process(tmp_path: Path) -> None:
    """Every kind of layer, sharded with FSDP2 (``fully_shard``) over two processes that each
    take half of every batch, ends three SGD steps (with no-grad evaluations between them) where
    the unsharded stack trained on whole batches does. Learnable scalars are one-element vectors:
    ``fully_shard`` refused the 0-d ones (entmax's alpha, a shared sink logit, a gain)."""
    script = str(Path(__file__).with_name("fsdp_layers_script.py"))
    torchrun([script, str(tmp_path)], cwd=tmp_path)
    found = json.loads((tmp_path / "fsdp.json").read_text())
    assert found["processes"] == 2 and found["sharded"]
    assert found["difference"] < 1e-5, found
