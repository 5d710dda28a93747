"""The native CPU kernels (hopfield.functional.native) against PyTorch references: selection,
gathered products and their scatter; the build cache, the switch and the fallback."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hopfield.functional import native

pytestmark = pytest.mark.skipif(
    not native.available(torch.zeros(1)), reason="the native kernels did not build here"
)


def _same_selection(x: torch.Tensor, k: int, values: torch.Tensor, cols: torch.Tensor) -> None:
    """``(values, cols)`` is a top-``k`` of each row: the right values, read at those columns,
    with distinct columns."""
    expected = x.topk(k, dim=-1).values
    torch.testing.assert_close(values.sort(-1, descending=True).values, expected, equal_nan=True)
    torch.testing.assert_close(x.gather(-1, cols), values, equal_nan=True)
    assert bool((cols.sort(-1).values.diff(dim=-1) > 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width,k", [(1, 1), (7, 7), (9, 3), (130, 64), (2048, 64), (5000, 17)])
@pytest.mark.parametrize("threads", [1, 2])
def test_topk_matches_torch(dtype, width, k, threads) -> None:
    torch.set_num_threads(threads)
    try:
        x = torch.randn(37, width, dtype=dtype)
        values, cols = native.topk(x, k)
        assert values.dtype == dtype and cols.dtype == torch.int64
        _same_selection(x, k, values, cols)
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("chunk", [1, 3, 64, 500])
def test_running_topk_over_chunks_matches_topk_of_the_whole_row(chunk) -> None:
    x = torch.randn(50, 1200, dtype=torch.float64)
    selection = native.RunningTopK(50, 64, torch.float64)
    for lo in range(0, 1200, chunk):
        selection.push(x[:, lo : lo + chunk])
    _same_selection(x, 64, *selection.result())


def test_topk_ties_keep_first_columns_nan_is_largest_and_masked_rows_stay_finite_free() -> None:
    x = torch.full((4, 100), -math.inf)
    x[1, 50] = 1.0
    x[2] = 0.0
    x[3, 40] = math.nan
    values, cols = native.topk(x, 10)
    assert bool(torch.isneginf(values[0]).all()) and sorted(cols[0].tolist()) == list(range(10))
    assert 50 in cols[1].tolist() and sorted(cols[1].tolist()) == [*range(9), 50]
    assert sorted(cols[2].tolist()) == list(range(10)) and bool((values[2] == 0).all())
    assert 40 in cols[3].tolist() and int(values[3].isnan().sum()) == 1


def test_topk_of_structured_scores_that_fill_the_buffer() -> None:
    # Increasing rows: every entry beats the bound of the first chunk, so the buffer is cut
    # again and again; decreasing rows: nothing after the first entries enters.
    up = torch.arange(3000, dtype=torch.float32).repeat(3, 1)
    for x in (up, up.flip(-1), up % 7):
        selection = native.RunningTopK(3, 32, torch.float32)
        for lo in range(0, 3000, 256):
            selection.push(x[:, lo : lo + 256])
        values, cols = selection.result()
        torch.testing.assert_close(values.sort(-1, descending=True).values, x.topk(32).values)
        torch.testing.assert_close(x.gather(-1, cols), values)


def test_topk_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k must lie in"):
        native.topk(torch.zeros(2, 3), 4)
    with pytest.raises(TypeError, match="dtype"):
        native.RunningTopK(2, 1, torch.float16)
    selection = native.RunningTopK(2, 3, torch.float32)
    with pytest.raises(ValueError, match="2 rows"):
        selection.push(torch.zeros(3, 5))
    selection.push(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="fewer than k"):
        selection.result()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_gather_dot_and_scatter_outer_match_pytorch(dtype, threads) -> None:
    torch.set_num_threads(threads)
    try:
        a = torch.randn(3, 5, 13, dtype=dtype)  # E = 13: not a multiple of the 8 lanes
        table = torch.randn(40, 13, dtype=dtype)
        idx = torch.randint(0, 40, (3, 5, 9))
        expected = (table[idx] * a.unsqueeze(-2)).sum(-1)
        torch.testing.assert_close(native.gather_dot(a, table, idx), expected)
        w = torch.randn(3, 5, 9, dtype=dtype)
        w[0, 0, :4] = 0.0
        dst = torch.randn(40, 13, dtype=dtype)
        products = (w.unsqueeze(-1) * a.unsqueeze(-2)).reshape(-1, 13)
        reference = dst.clone().index_add_(0, idx.reshape(-1), products)
        torch.testing.assert_close(native.scatter_outer(dst, idx, w, a), reference)
    finally:
        torch.set_num_threads(1)


def test_scatter_outer_skips_zero_weights_even_against_inf() -> None:
    dst = torch.zeros(4, 2)
    src = torch.tensor([[math.inf, 1.0]])
    native.scatter_outer(dst, torch.tensor([[1, 2]]), torch.tensor([[0.0, 2.0]]), src)
    assert bool(torch.isfinite(dst[1]).all()) and dst[2].tolist() == [math.inf, 2.0]


def test_gathered_products_reject_out_of_range_indices_and_bad_shapes() -> None:
    a, table = torch.randn(2, 4), torch.randn(6, 4)
    with pytest.raises(ValueError, match=r"indices in \[0, 6\)"):
        native.gather_dot(a, table, torch.tensor([[0, 6], [1, 2]]))
    with pytest.raises(ValueError, match=r"table must be"):
        native.gather_dot(a, torch.randn(6, 3), torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="dst must be"):
        native.scatter_outer(table.t(), torch.zeros(2, 1, dtype=torch.int64), a[:, :1], a)


def test_available_only_for_cpu_float32_and_float64_and_when_enabled(monkeypatch) -> None:
    assert native.available(torch.zeros(2), torch.zeros(2, dtype=torch.int64))
    assert not native.available(torch.zeros(2, dtype=torch.float16))
    assert not native.available(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not native.available(torch.zeros(2, device="meta"))
    assert not native.available(torch.zeros(2, dtype=torch.int64))  # no floating-point data
    assert native.usable_on(torch.device("cpu")) and not native.usable_on(torch.device("meta"))
    monkeypatch.setenv("HOPFIELD_NATIVE", "0")
    assert not native.available(torch.zeros(2))
    assert not native.usable_on(torch.device("cpu"))


def _in_fresh_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_without_a_compiler_one_warning_and_the_pytorch_path(tmp_path: Path) -> None:
    done = _in_fresh_python(
        """
        import warnings, torch
        from hopfield.functional import native, TopK, Softmax, associate
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not native.available(torch.zeros(1))
            assert not native.available(torch.zeros(1))
        assert len(caught) == 1 and "no C compiler" in str(caught[0].message), caught
        q = torch.randn(1, 2, 30, 4)
        out = associate(q, q, q, separation=Softmax(), structure=TopK(5))
        assert out.shape == (1, 2, 30, 4)
        """,
        {"CC": str(tmp_path / "no-such-compiler"), "HOPFIELD_CACHE": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr


def test_processes_building_at_once_share_one_cached_library(tmp_path: Path) -> None:
    code = """
        import torch
        from hopfield.functional import native
        x = torch.randn(8, 100)
        assert native.available(x)
        values, cols = native.topk(x, 5)
        assert torch.equal(values.sort(-1, descending=True).values, x.topk(5).values)
        """
    env = {"HOPFIELD_CACHE": str(tmp_path)}
    command = [sys.executable, "-c", textwrap.dedent(code)]
    running = [
        subprocess.Popen(command, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for process in running:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    libraries = list(tmp_path.glob("native/*/hopfield_kernels.so"))
    assert len(libraries) == 1
    assert not list(tmp_path.glob("native/*/*.so.tmp*")) and len(list(tmp_path.rglob("*"))) == 3


def test_running_topk_restarts_on_its_buffers_for_fewer_rows() -> None:
    selection = native.RunningTopK(40, 8, torch.float32)
    for rows in (40, 13):
        x = torch.randn(rows, 300)
        selection.restart(rows)
        selection.push(x[:, :100])
        selection.push(x[:, 100:])
        _same_selection(x, 8, *selection.result())
    with pytest.raises(ValueError, match="rows must lie in"):
        selection.restart(41)


def test_floyd_sample_gives_the_subsets_of_the_pytorch_floyd_sample() -> None:
    from hopfield.functional.efficient import floyd_sample

    gen = torch.Generator().manual_seed(4)
    n = torch.randint(1, 200, (300,), generator=gen)
    count = torch.minimum(torch.randint(0, 40, (300,), generator=gen), n)
    count[:3] = torch.stack([torch.tensor(0), n[1].clamp_max(40), torch.tensor(1)])
    rand = torch.rand(300, 40, generator=gen)
    ours = native.floyd_sample(count, n, 40, rand)
    assert torch.equal(ours, floyd_sample(count, n, 40, rand))
    for row in range(300):
        picked = ours[row, : int(count[row])]
        assert picked.unique().numel() == int(count[row]) and bool((picked < n[row]).all())
    with pytest.raises(ValueError, match="count must lie"):
        native.floyd_sample(torch.tensor([5]), torch.tensor([4]), 8, torch.rand(1, 8))
