"""Tests of the vision Hopfield transformer and the ``convergence`` experiment."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hopfield.data.files import DataNotFoundError
from hopfield.experiments import run_experiment
from hopfield.experiments.convergence import (
    MODELS,
    PAPER_TABLE3,
    PRESETS,
    Config,
    _claim_note,
    build_model,
    run,
)
from hopfield.experiments.results import RunContext
from hopfield.functional import Softmax, SoftmaxN, Sparsemax
from hopfield.models.vision import (
    HopfieldBlock,
    PatchEmbedding,
    VisionHopfield,
    num_patches,
    vision_hopfield_parameters,
)


def small_vit(**kwargs: object) -> VisionHopfield:
    settings: dict[str, object] = dict(
        patch_size=4, embed_dim=16, num_heads=2, mlp_dim=24, depth=2, separation=SoftmaxN(1.0)
    )
    settings.update(kwargs)
    return VisionHopfield(8, 1, 10, **settings)  # type: ignore[arg-type]


# --- the model --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "channels", "patch", "expected"),
    [(8, 1, 4, 4), (28, 1, 7, 16), (28, 1, 32, 1), (32, 3, 8, 16)],
)
def test_patch_embedding_shapes_and_padding(
    image: int, channels: int, patch: int, expected: int
) -> None:
    embed = PatchEmbedding(image, channels, patch, 12)
    assert embed.num_patches == expected == num_patches(image, patch)
    out = embed(torch.rand(3, channels, image, image))
    assert out.shape == (3, expected, 12)


def test_patch_embedding_is_a_linear_map_of_each_patch() -> None:
    embed = PatchEmbedding(8, 1, 4, 5)
    images = torch.rand(2, 1, 8, 8)
    out = embed(images)
    # patch (row 1, col 0) is token 2 (row-major order)
    patch = images[:, :, 4:8, 0:4].reshape(2, -1)
    expected = patch @ embed.proj.weight.view(5, -1).T + embed.proj.bias
    torch.testing.assert_close(out[:, 2], expected)


def test_patch_embedding_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="images"):
        PatchEmbedding(8, 1, 4, 5)(torch.rand(2, 1, 7, 7))
    with pytest.raises(ValueError, match="patch_size"):
        PatchEmbedding(8, 1, 0, 5)
    with pytest.raises(TypeError, match="embed_dim"):
        PatchEmbedding(8, 1, 4, 5.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", sorted(MODELS))
def test_model_output_shape_and_separation(key: str) -> None:
    config = replace(PRESETS["tiny"], depth=2)
    model = build_model(config, key, 8, 1, 10)
    logits = model(torch.rand(5, 1, 8, 8))
    assert logits.shape == (5, 10)
    expected = {"dense": Softmax, "sparse": Sparsemax, "outeffhop": SoftmaxN}[key]
    for block in model.blocks:
        assert isinstance(block, HopfieldBlock)
        assert type(block.hopfield.separation) is expected
        if key == "outeffhop":
            assert block.hopfield.separation.n == 1.0
    # each block owns its separation map
    assert model.blocks[0].hopfield.separation is not model.blocks[1].hopfield.separation


def test_the_separation_is_used_in_the_forward_pass() -> None:
    """Attention weights of each block follow its separation: Softmax_1 rows sum below 1,
    softmax rows to 1, sparsemax rows contain exact zeros."""
    x = torch.randn(4, 6, 16) * 3
    sums = {}
    for key in MODELS:
        torch.manual_seed(0)
        block = HopfieldBlock(16, 2, 24, MODELS[key][1]())
        out = block.hopfield(block.norm1(x), return_weights=True)
        sums[key] = out.weights
    torch.testing.assert_close(sums["dense"].sum(-1), torch.ones(4, 2, 6))
    assert bool((sums["outeffhop"].sum(-1) < 1).all())
    assert bool((sums["sparse"] == 0).any())
    torch.testing.assert_close(sums["sparse"].sum(-1), torch.ones(4, 2, 6))


def test_parameter_count_formula() -> None:
    for kwargs in ({}, {"depth": 3, "mlp_dim": 40}, {"patch_size": 3}):
        model = small_vit(**kwargs)
        count = sum(p.numel() for p in model.parameters())
        settings = {"patch_size": 4, "embed_dim": 16, "mlp_dim": 24, "depth": 2, **kwargs}
        assert count == vision_hopfield_parameters(8, 1, 10, **settings)  # type: ignore[arg-type]
    paper = vision_hopfield_parameters(
        32, 3, 10, patch_size=32, embed_dim=512, mlp_dim=1024, depth=3
    )
    assert paper == sum(
        p.numel()
        for p in VisionHopfield(
            32,
            3,
            10,
            patch_size=32,
            embed_dim=512,
            num_heads=4,
            mlp_dim=1024,
            depth=3,
            separation=Softmax(),
            device="meta",
        ).parameters()
    )


def test_model_trains_and_reset_parameters() -> None:
    model = small_vit()
    images, labels = torch.rand(32, 1, 8, 8), torch.randint(0, 10, (32,))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    model.reset_parameters()
    head = model.head
    assert torch.equal(head.bias, torch.zeros_like(head.bias))
    assert float(model.cls_token.detach().abs().max()) <= 0.04
    assert float(model.pos_embed.detach().abs().max()) <= 0.04


def test_model_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="separation"):
        small_vit(separation="softmax")
    with pytest.raises(ValueError, match="dropout"):
        small_vit(dropout=1.5)
    with pytest.raises(ValueError, match="depth"):
        small_vit(depth=0)
    with pytest.raises(ValueError, match="divisible"):
        small_vit(num_heads=3)


def test_dtype_and_device_factory_arguments() -> None:
    model = small_vit(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model(torch.rand(2, 1, 8, 8, dtype=torch.float64)).dtype == torch.float64


# --- the experiment ---------------------------------------------------------------------------


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="models"):
        Config(models=("dense", "nope"))
    with pytest.raises(ValueError, match="epochs"):
        Config(epochs=0)
    with pytest.raises(ValueError, match="schedule"):
        Config(schedule="step")
    with pytest.raises(ValueError, match="until_epoch"):
        Config(until_epoch=-1)
    paper = PRESETS["paper"]
    assert (paper.lr, paper.embed_dim, paper.mlp_dim, paper.dropout) == (1e-4, 512, 1024, 0.3)
    assert (paper.epochs, paper.batch_size, paper.patch_size) == (100, 512, 32)
    assert PAPER_TABLE3["optimizer"] == "Adam"
    assert PRESETS["tiny"].datasets == ("digits",)


def _curves(path: Path) -> dict[str, object]:
    return json.loads((path.parent / "curves.json").read_text())


def test_tiny_end_to_end_and_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = run_experiment("convergence", "tiny", tmp_path / "full", progress=False)
    record = json.loads(full.read_text())
    results = record["results"]
    names = [t["name"] for t in results["tables"]]
    assert names == ["Table 3: hyper-parameters", "Convergence on digits", "Curves on digits"]
    curves = _curves(full)["digits"]
    epochs = PRESETS["tiny"].epochs
    for key in MODELS:
        (one,) = curves[key]
        assert len(one["train_loss"]) == len(one["test_accuracy"]) == epochs
        assert one["finished"]
        assert one["train_loss"][-1] < one["train_loss"][0]
        assert 0.0 <= one["test_accuracy"][-1] <= 1.0
        assert results["metrics"][f"digits/{key}/final_test_accuracy"] == one["test_accuracy"][-1]
    assert (full.parent / "convergence.png").stat().st_size > 0
    assert any("paper claim" in note for note in results["notes"])

    # stopped after epoch 1, then continued: the same curves as the uninterrupted run
    first = run_experiment(
        "convergence", "tiny", tmp_path / "split", overrides={"until_epoch": "1"}, progress=False
    )
    partial = _curves(first)["digits"]
    assert all(len(partial[k][0]["test_accuracy"]) == 1 for k in MODELS)
    assert not partial["dense"][0]["finished"]
    assert any(
        "stopped after step 6 (epoch 1 of 2" in n
        for n in json.loads(first.read_text())["results"]["notes"]
    )
    second = run_experiment("convergence", "tiny", tmp_path / "split", progress=False)
    assert _curves(second) == _curves(full)

    # a run whose settings changed starts over (and says so); an absent dataset is skipped
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path / "nothing"))
    third = run_experiment(
        "convergence",
        "tiny",
        tmp_path / "split",
        overrides={"epochs": "1", "datasets": '["digits", "cifar10"]'},
        progress=False,
    )
    notes = json.loads(third.read_text())["results"]["notes"]
    assert any(n.startswith("cifar10 skipped") for n in notes)
    assert sum("trained from scratch" in n for n in notes) == len(MODELS)
    assert len(_curves(third)["digits"]["dense"][0]["test_accuracy"]) == 1


def test_absent_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path / "nothing"))
    config = replace(PRESETS["tiny"], datasets=("cifar10",))
    with pytest.raises(DataNotFoundError):
        run(config, RunContext(out_dir=tmp_path / "a", progress=False))
    with pytest.raises(TypeError, match="config"):
        run(object(), RunContext(out_dir=tmp_path / "b", progress=False))  # type: ignore[arg-type]


def test_absent_dataset_stands_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With stand-in data an absent dataset trains on random images of its shapes (with a
    note); the run folder records that, so the real data later start the run over."""
    monkeypatch.setenv("HOPFIELD_DATA", str(tmp_path / "nothing"))
    config = replace(PRESETS["tiny"], datasets=("cifar100",), models=("outeffhop",), test_size=50)
    ctx = RunContext(out_dir=tmp_path / "a", progress=False, stand_in_data=True)
    results = run(config, ctx)
    assert any(n.startswith("cifar100: trained and evaluated on STAND-IN") for n in results.notes)
    curves = json.loads((tmp_path / "a" / "curves.json").read_text())
    (one,) = curves["cifar100"]["outeffhop"]
    assert one["finished"] and len(one["test_accuracy"]) == config.epochs
    assert (one["steps"], one["processes"]) == (config.epochs * (384 // 64), 1)
    settings = json.loads(
        (tmp_path / "a" / "runs" / "cifar100-outeffhop-seed0" / "settings.json").read_text()
    )
    assert settings["data"].startswith("STAND-IN random images of cifar100")
    table = next(t for t in results.tables if t.name == "Table 3: hyper-parameters")
    params = dict((r[0], r[2]) for r in table.rows)["parameters (cifar100)"]
    assert params == vision_hopfield_parameters(
        32, 3, 100, patch_size=4, embed_dim=16, mlp_dim=32, depth=1
    )


DOC = Path(__file__).resolve().parents[1] / "docs" / "convergence.md"


def test_documentation_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert blocks
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/convergence.md[python block {i}]", "exec"), {})


def test_claim_note_verdicts() -> None:
    def runs(*areas: list[float]) -> dict[str, list[dict[str, object]]]:
        return {
            key: [{"test_accuracy": [a, a]} for a in values]
            for key, values in zip(("dense", "sparse", "outeffhop"), areas, strict=True)
        }

    assert "claim: holds at" in str(_claim_note("d", runs([0.5, 0.52], [0.4, 0.41], [0.7, 0.71])))
    close = _claim_note("d", runs([0.70, 0.72], [0.4, 0.41], [0.71, 0.715]))
    assert "no clear difference" in str(close)
    assert "not reproduced" in str(_claim_note("d", runs([0.9, 0.91], [0.4, 0.41], [0.5, 0.51])))
    assert "single seed" in str(_claim_note("d", runs([0.5], [0.4], [0.6])))
    assert _claim_note("d", {"dense": [{"test_accuracy": [0.5]}]}) is None
