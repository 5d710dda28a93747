"""The native CPU kernels (hopfield.functional.native) against PyTorch references: selection,
gathered products and their scatter; the build cache, the switch and the fallback."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hopfield.functional import native
from hopfield.functional.efficient import floyd_sample

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
    libraries = list(tmp_path.glob("native/*/hopfield_kernels-*.so"))
    assert len(libraries) == 1
    # native/, native/<key>/, the library and its manifest: no temporary files left
    assert len(list(tmp_path.rglob("*"))) == 4
    assert (libraries[0].parent / "manifest.json").is_file()


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


# --- Input checks: every public kernel rejects what would make the C code read out of bounds.


def test_rms_kernels_reject_a_weight_or_shape_that_does_not_match_x() -> None:
    from hopfield.nn.rms_norm import rms_norm

    x = torch.ones(2, 64)
    with pytest.raises(ValueError, match=r"weight must be \(64,\)"):
        native.rms_forward(x, torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError):  # as F.rms_norm, which gets these now
        rms_norm(x, [64], torch.ones(4), 1e-6)
    with pytest.raises(RuntimeError):
        rms_norm(torch.ones(2, 8), [4], None, 1e-6)
    with pytest.raises(TypeError, match=r"weight must be torch\.float32"):
        native.rms_forward(x, torch.ones(64, dtype=torch.float64), 1e-6)
    with pytest.raises(ValueError, match="eps must be"):
        native.rms_forward(x, None, -1.0)
    y, inv = native.rms_forward(x, None, 1e-6)
    with pytest.raises(ValueError, match="expected grad"):
        native.rms_backward(torch.ones(2, 63), x, None, inv, weight_grad=False)
    with pytest.raises(ValueError, match="expected grad"):
        native.rms_backward(y, x, None, inv[:1], weight_grad=False)
    with pytest.raises(ValueError, match="x must be on the CPU"):
        native.rms_forward(torch.ones(2, 64, device="meta"), None, 1e-6)


def test_gathered_products_reject_mixed_dtypes_and_float_indices() -> None:
    a, table = torch.randn(2, 4), torch.randn(6, 4, dtype=torch.float64)
    idx = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"table must be torch\.float32"):
        native.gather_dot(a, table, idx)
    with pytest.raises(TypeError, match="idx must hold integers"):
        native.gather_dot(a, table.float(), idx.double())
    with pytest.raises(TypeError, match=r"w must be torch\.float64"):
        native.scatter_outer(table, idx, torch.ones(2, 3), a.double())
    with pytest.raises(TypeError, match=r"src must be torch\.float64"):
        native.scatter_outer(table, idx, torch.ones(2, 3, dtype=torch.float64), a)
    with pytest.raises(TypeError, match=r"a must be a torch\.Tensor"):
        native.gather_dot([1.0], table, idx)  # type: ignore[arg-type]


def test_floyd_sample_rejects_uniforms_outside_the_unit_interval_and_bad_shapes() -> None:
    count, n = torch.tensor([2, 1]), torch.tensor([5, 3])
    for bad in (-0.5, math.nan, math.inf):
        rand = torch.rand(2, 3)
        rand[1, 0] = bad
        with pytest.raises(ValueError, match=r"rand must hold uniforms in \[0, 1\]"):
            native.floyd_sample(count, n, 3, rand)
    with pytest.raises(ValueError, match="expected n"):
        native.floyd_sample(count, n.view(2, 1), 3, torch.rand(2, 3))
    with pytest.raises(TypeError, match="count must hold integers"):
        native.floyd_sample(count.float(), n, 3, torch.rand(2, 3))
    edge = native.floyd_sample(count, n, 3, torch.ones(2, 3))  # u = 1 picks the top key
    assert edge[0, :2].tolist() == [3, 4] and edge[1, 0].item() == 2


def test_a_failed_allocation_in_the_kernels_is_a_memory_error() -> None:
    # Floyd's byte map holds max(n) bytes: 2^62 cannot be had.
    with pytest.raises(MemoryError, match="hop_floyd"):
        native.floyd_sample(torch.tensor([0]), torch.tensor([2**62]), 1, torch.rand(1, 1))


def test_running_topk_rejects_negative_offsets_and_pushes_after_its_result() -> None:
    selection = native.RunningTopK(2, 2, torch.float32)
    with pytest.raises(ValueError, match="offset must be at least 0"):
        selection.push(torch.randn(2, 5), offset=-50)
    with pytest.raises(TypeError, match=r"x must be torch\.float32"):
        selection.push(torch.randn(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="k must be at least 1"):
        native.RunningTopK(2, 0, torch.float32)
    x = torch.randn(2, 5)
    selection.push(x)
    _same_selection(x, 2, *selection.result())
    with pytest.raises(RuntimeError, match="restart"):
        selection.push(x)
    with pytest.raises(RuntimeError, match="restart"):
        selection.result()
    selection.restart(2)
    selection.push(x, offset=10)
    values, cols = selection.result()
    _same_selection(x, 2, values, cols - 10)


# --- The build cache: only this user's verified builds are loaded; damage means a rebuild.


@pytest.fixture(scope="module")
def copying_compiler(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A stand-in C compiler (``$CC``) that "builds" by copying one real build of the kernels
    (compiled once here), so that the cache tests rebuild in no time."""
    folder = tmp_path_factory.mktemp("compiler")
    good = folder / "kernels.so"
    flags = native._FLAG_SETS[-1]
    subprocess.run(["cc", *flags, "-o", good, native._SOURCE, "-lm"], check=True)
    script = folder / "copy-cc"
    script.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = -o ] && exec cp ' + f"{good} " + '"$2"; shift; done\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def fresh_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copying_compiler: str):
    """``native._library`` forgotten, with the cache in ``tmp_path/cache`` and
    ``copying_compiler``; forgotten again afterwards so that later tests load the usual build."""
    monkeypatch.setenv("HOPFIELD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", copying_compiler)
    native._library.cache_clear()
    yield tmp_path / "cache"
    native._library.cache_clear()


def _cached(cache: Path) -> tuple[Path, dict]:
    """The one cached library under ``cache`` and its manifest."""
    (manifest,) = cache.glob("native/*/manifest.json")
    record = json.loads(manifest.read_text())
    return manifest.parent / record["library"], record


def _foreign_library(folder: Path, marker: Path) -> Path:
    """A library that writes ``marker`` when it is loaded (and has none of the kernels)."""
    source = folder / "foreign.c"
    source.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {"
        f' FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
    )
    library = folder / "foreign.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    return library


def _replace(path: Path, data: bytes) -> None:
    """A new file with ``data`` at ``path`` (writing into the old one would damage the library
    this process has loaded from it)."""
    path.with_suffix(".new").write_bytes(data)
    os.replace(path.with_suffix(".new"), path)


def _plant(library: Path, cache: Path) -> None:
    """Put ``library`` in the place of the cached build, with a manifest that vouches for it."""
    cached, record = _cached(cache)
    data = library.read_bytes()
    _replace(cached, data)
    record.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (cached.parent / "manifest.json").write_text(json.dumps(record))


def test_a_library_planted_where_others_may_write_is_not_loaded(fresh_library: Path) -> None:
    x = torch.randn(4, 50)
    assert native._library() is not None  # a verified build in fresh_library
    native._library.cache_clear()
    marker = fresh_library.parent / "planted-ran"
    _plant(_foreign_library(fresh_library.parent, marker), fresh_library)
    fresh_library.chmod(0o777)  # e.g. HOPFIELD_CACHE=/tmp: anyone could have put it there
    with pytest.warns(RuntimeWarning, match="only you may write to") as caught:
        assert not native.available(x) and not native.available(x)
    assert len(caught) == 1 and not marker.exists()
    from hopfield.functional.efficient import top_scores

    values, _ = top_scores(x, 5)  # the PyTorch path
    torch.testing.assert_close(values.sort(-1).values, x.topk(5).values.sort(-1).values)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_a_cache_folder_of_another_user_is_not_used(fresh_library: Path) -> None:
    fresh_library.mkdir(mode=0o700)
    os.chown(fresh_library, 65534, -1)
    with pytest.warns(RuntimeWarning, match="owner uid 65534"):
        assert native._library() is None
    assert not list(fresh_library.rglob("*"))


def test_a_cached_library_without_the_kernels_is_rebuilt(fresh_library: Path) -> None:
    assert native._library() is not None
    native._library.cache_clear()
    _, before = _cached(fresh_library)
    # A foreign library its (forged) manifest vouches for: loaded, but it lacks the kernels.
    _plant(_foreign_library(fresh_library.parent, fresh_library.parent / "ran"), fresh_library)
    x = torch.randn(3, 40)
    assert native.available(x)
    torch.testing.assert_close(native.topk(x, 4)[0].sort(-1).values, x.topk(4)[0].sort(-1).values)
    library, after = _cached(fresh_library)
    assert after == before and hashlib.sha256(library.read_bytes()).hexdigest() == after["sha256"]


@pytest.mark.parametrize("manifest", ["", "{", "[]", '{"library": "../elsewhere.so"}'])
def test_a_damaged_manifest_means_a_rebuild(fresh_library: Path, manifest: str) -> None:
    assert native._library() is not None
    native._library.cache_clear()
    library, record = _cached(fresh_library)
    (library.parent / "manifest.json").write_text(manifest)
    assert native._library() is not None
    assert _cached(fresh_library) == (library, record)


def test_a_damaged_cached_library_is_rebuilt_not_loaded(fresh_library: Path) -> None:
    # In a child process: loading a truncated library would kill it with SIGBUS.
    assert native._library() is not None
    library, record = _cached(fresh_library)
    done = _in_fresh_python(
        f"""
        import pathlib, torch
        from hopfield.functional import native
        library = pathlib.Path({str(library)!r})
        for size in (0, 4096, 20000, 40000):
            data = library.read_bytes()[:size]
            library.with_suffix(".new").write_bytes(data)  # damaged in an earlier process
            library.with_suffix(".new").replace(library)
            native._library.cache_clear()
            x = torch.randn(3, 40)
            assert native.available(x), size
            values, _ = native.topk(x, 4)
            assert torch.equal(values.sort(-1).values, x.topk(4).values.sort(-1).values)
        """,
        {"HOPFIELD_CACHE": str(fresh_library), "CC": os.environ["CC"]},
    )
    assert done.returncode == 0, done.stderr
    assert _cached(fresh_library) == (library, record)  # rebuilt with the first flags
    assert len(list(fresh_library.glob("native/*"))) == 1


def test_a_compiler_that_writes_nothing_leaves_nothing_cached(
    fresh_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fresh_library.parent / "fake-cc"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.warns(RuntimeWarning, match="wrote no library"):
        assert native._library() is None
    assert not [p for p in fresh_library.rglob("*") if p.is_file()]


def test_a_compiler_command_with_arguments_builds(
    fresh_library: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = os.environ["CC"]
    monkeypatch.setenv("CC", f"env {compiler}")  # a program and its arguments, as "ccache gcc"
    assert native._compiler() == [shutil.which("env"), compiler]
    assert native._library() is not None
    assert _cached(fresh_library)[0].is_file()


def test_temporary_files_of_dead_builds_are_removed(fresh_library: Path) -> None:
    assert native._library() is not None
    native._library.cache_clear()
    folder = _cached(fresh_library)[0].parent
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    host = platform.node()
    dead = folder / f".build-{host}-{int(done.stdout)}-abc123.so"
    live = folder / f".build-{host}-{os.getpid()}-abc123.so"
    old = folder / ".build-other-host-1-abc123.json"
    for path in (dead, live, old):
        path.write_bytes(b"partial")
    os.utime(old, (0, 0))
    assert native._library() is not None
    assert live.exists() and not dead.exists() and not old.exists()


def test_a_build_killed_with_sigkill_leaves_no_files_behind(fresh_library: Path) -> None:
    stuck = fresh_library.parent / "stuck-cc"  # prints no version (as copying_compiler): same key
    stuck.write_text('#!/bin/sh\n[ "$1" = --version ] && exit 0\nexec sleep 60\n')
    stuck.chmod(0o755)
    child = subprocess.Popen(
        [sys.executable, "-c", "from hopfield.functional import native; native._library()"],
        env={**os.environ, "CC": str(stuck), "HOPFIELD_CACHE": str(fresh_library)},
        start_new_session=True,  # its own process group: the compiler dies with it
    )
    try:
        deadline = time.monotonic() + 120
        while not list(fresh_library.glob("native/*/.build-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    (orphan,) = fresh_library.glob("native/*/.build-*")
    assert native._library() is not None  # the next build, in this process
    assert not orphan.exists() and _cached(fresh_library)[0].parent == orphan.parent


def test_threads_follow_the_work_and_small_calls_stay_on_one_thread() -> None:
    torch.set_num_threads(3)
    try:
        assert native._threads(100) == 1  # no parallel region for small work
        assert native._threads(2 * native._GRAIN) == 2
        assert native._threads(10**9) == 3
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernels_split_into_claimed_pieces_match_pytorch(dtype) -> None:
    """Work large enough for 3 threads, whose rows (an odd count) are cut into pieces the
    threads claim in turn: the results are those of PyTorch."""
    torch.set_num_threads(3)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(301, 2000, dtype=dtype, generator=gen)
        values, cols = native.topk(x, 7)
        _same_selection(x, 7, values, cols)
        a = torch.randn(301, 64, dtype=dtype, generator=gen)
        table = torch.randn(500, 64, dtype=dtype, generator=gen)
        idx = torch.randint(0, 500, (301, 40), generator=gen)
        expected = (table[idx] * a.unsqueeze(-2)).sum(-1)
        torch.testing.assert_close(native.gather_dot(a, table, idx), expected)
        w = torch.randn(301, 40, dtype=dtype, generator=gen)
        products = (w.unsqueeze(-1) * a.unsqueeze(-2)).reshape(-1, 64)
        reference = table.clone().index_add_(0, idx.reshape(-1), products)
        torch.testing.assert_close(native.scatter_outer(table.clone(), idx, w, a), reference)
        n = torch.full((20001,), 50, dtype=torch.int64)
        count = torch.full((20001,), 4, dtype=torch.int64)
        rand = torch.rand(20001, 4, generator=gen)
        torch.testing.assert_close(
            native.floyd_sample(count, n, 4, rand), floyd_sample(count, n, 4, rand)
        )
    finally:
        torch.set_num_threads(1)


def _kept_reference(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of x with the entries native.topk selects kept and -inf elsewhere."""
    out = torch.full_like(x, -math.inf)
    for r in range(x.shape[0]):
        count = int(counts[r].clamp(0, x.shape[1]))
        if count:
            values, cols = native.topk(x[r : r + 1], count)
            out[r, cols[0]] = values[0]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width,k", [(1, 1), (9, 3), (130, 64), (300, 7), (64, 63)])
@pytest.mark.parametrize("threads", [1, 2])
def test_topk_keep_keeps_the_topk_selection_and_weighs_it(dtype, width, k, threads) -> None:
    """Every output of topk_keep against topk's selection and Softmax_n in float64, with integer
    scores (ties: first columns), per-row counts (0 and above the width), a fully -inf row."""
    from hopfield.functional import SoftmaxN

    torch.set_num_threads(threads)
    try:
        for x in (torch.randn(40, width, dtype=dtype) * 4, torch.randint(0, 3, (40, width))):
            x = x.to(dtype)
            x[3] = -math.inf
            counts = torch.full((40,), k)
            counts[:3] = torch.tensor([0, width + 5, 1])
            for count in (k, counts):
                kept = _kept_reference(
                    x, counts if isinstance(count, torch.Tensor) else counts * 0 + k
                )
                assert torch.equal(native.topk_keep(x, count, scale=1.0), kept)
                assert torch.equal(native.topk_keep(x, count, scale=0.5), kept * 0.5)
                bias = native.topk_keep(x, count, output="bias")
                assert set(bias.unique().tolist()) <= {0.0, -math.inf}
                assert torch.equal(x + bias, kept)
                assert torch.equal(bias == 0, kept > -math.inf)
                in_place = x.clone()
                native.topk_keep(in_place, count, output="bias", out=in_place)
                assert torch.equal(in_place, bias)
                for n in (0.0, 1.0):
                    weights = native.topk_keep(x, count, output="softmax", scale=0.5, n=n)
                    expected = SoftmaxN(n)(kept.double() * 0.5)
                    tolerance = 1e-6 if dtype == torch.float32 else 1e-13
                    assert (weights.double() - expected).abs().max() < tolerance
                    assert (weights[kept == -math.inf] == 0).all()
                    assert (weights[3] == 0).all()
    finally:
        torch.set_num_threads(1)


def test_topk_keep_in_place_and_nan_is_largest() -> None:
    x = torch.tensor([[0.5, float("nan"), 2.0, -1.0]])
    kept = native.topk_keep(x, 2)
    assert torch.isnan(kept[0, 1]) and kept[0, 2] == 2.0 and (kept[0, [0, 3]] == -math.inf).all()
    y = torch.randn(5, 40)
    expected = native.topk_keep(y, 9, output="softmax")
    assert native.topk_keep(y, 9, output="softmax", out=y) is not None
    assert torch.equal(y, expected)


def test_topk_keep_rejects_bad_arguments() -> None:
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="output"):
        native.topk_keep(x, 3, output="weights")
    with pytest.raises(ValueError, match="one count per row"):
        native.topk_keep(x, torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="k must"):
        native.topk_keep(x, 2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="k must"):
        native.topk_keep(x, torch.ones(4))
    with pytest.raises(ValueError, match="out must"):
        native.topk_keep(x, 3, out=torch.empty(4, 11))
    with pytest.raises(TypeError, match="float32 or float64"):
        native.topk_keep(x.half(), 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sample_keep_keeps_count_of_the_population_uniformly(dtype) -> None:
    """sample_keep keeps min(count, population, W) columns among the first population of each
    row (count 0 keeps none), the same for a seed at any thread count, each column with
    probability count / population; its bias, values and Softmax_n agree with each other."""
    from hopfield.functional import SoftmaxN

    rows, width = 3000, 10
    x = torch.randn(rows, width, dtype=dtype)
    count = torch.randint(0, 12, (rows,))
    population = torch.randint(1, 13, (rows,))
    kept = native.sample_keep(x, count, population, seed=5)
    mask = kept > -math.inf
    assert torch.equal(mask.sum(-1), torch.minimum(count, population.clamp(max=width)))
    assert not (mask & (torch.arange(width) >= population.unsqueeze(-1))).any()
    assert torch.equal(kept[mask], x[mask])
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        assert torch.equal(native.sample_keep(x, count, population, seed=5), kept)
    finally:
        torch.set_num_threads(threads)
    assert not torch.equal(native.sample_keep(x, count, population, seed=6), kept)
    bias = native.sample_keep(x, count, population, seed=5, output="bias")
    assert torch.equal(x + bias, kept)
    weights = native.sample_keep(x, count, population, seed=5, output="softmax", scale=0.5, n=1)
    expected = SoftmaxN(1.0)(kept.double() * 0.5)
    assert (weights.double() - expected).abs().max() < (1e-6 if dtype == torch.float32 else 1e-13)
    many = native.sample_keep(torch.zeros(40000, 8, dtype=dtype), 3, 8, seed=1)
    rate = (many > -math.inf).double().mean(0)  # each column: 3 / 8, 6 sigma over 40,000 rows
    assert ((rate - 3 / 8).abs() < 6 * math.sqrt(3 / 8 * 5 / 8 / 40000)).all()


def test_sample_keep_rejects_bad_arguments() -> None:
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="seed"):
        native.sample_keep(x, 3, 10, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        native.sample_keep(x, 3, 10, seed=1 << 64)
    with pytest.raises(ValueError, match="population must hold one count per row"):
        native.sample_keep(x, 3, torch.ones(5, dtype=torch.int64), seed=0)
    with pytest.raises(TypeError, match="count must"):
        native.sample_keep(x, 2.0, 10, seed=0)  # type: ignore[arg-type]


def test_sample_indices_are_sample_keeps_subsets_in_any_cut_of_the_queries() -> None:
    """sample_indices and sample_keep draw the same subsets from a seed, and blocks of queries
    (start, length) draw what the whole call draws."""
    x = torch.randn(2, 3, 9, 20)
    count = torch.randint(0, 8, (2, 3, 9))
    population = torch.randint(1, 21, (2, 3, 9))
    whole = native.sample_keep(x, count, population, 42)
    blocks = [
        native.sample_keep(
            x[:, :, lo:hi], count[:, :, lo:hi], population[:, :, lo:hi], 42, start=lo, length=9
        )
        for lo, hi in ((0, 4), (4, 5), (5, 9))
    ]
    assert torch.equal(torch.cat(blocks, dim=-2), whole)
    idx = native.sample_indices(count, population, 8, 42)
    used = torch.arange(8) < torch.minimum(count, population).unsqueeze(-1)
    assert (idx[~used] == 0).all()
    marked = torch.zeros(x.shape).scatter_add_(-1, idx, used.float()) > 0
    assert torch.equal(marked, whole > -math.inf)
    assert (torch.zeros(x.shape).scatter_add_(-1, idx, used.float()) <= 1).all()  # distinct
    late = native.sample_indices(count[:, :, 5:], population[:, :, 5:], 8, 42, start=5, length=9)
    assert torch.equal(late, idx[:, :, 5:])
    with pytest.raises(ValueError, match="slots"):
        native.sample_indices(count, population, 1, 42)
    with pytest.raises(ValueError, match="length"):
        native.sample_indices(count, population, 8, 42, start=3, length=9)
    with pytest.raises(TypeError, match=r"count must be a torch\.Tensor"):
        native.sample_indices(3, population, 8, 42)  # type: ignore[arg-type]


_WORD = (1 << 64) - 1


def _floyd_stream_reference(seed: int, stream: int, count: int, n: int) -> list[int]:
    """The kernels' picks of one stream in plain Python integers: Floyd's algorithm on the
    splitmix64 stream of ``(seed, stream)``, pick ``i`` the high word of ``draw * (top + 1)``
    with ``top = n - count + i``, or ``top`` itself when that is taken."""
    state, picks = seed ^ (stream * 0xD1342543DE82EF95 & _WORD), []
    for i in range(count):
        z = (state + (i + 1) * 0x9E3779B97F4A7C15) & _WORD
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _WORD
        z ^= z >> 31
        top = n - count + i
        pick = (z * (top + 1)) >> 64
        picks.append(top if pick in picks else pick)
    return picks


@pytest.mark.parametrize(
    ("largest", "start", "length"), [(128, 0, None), (129, 0, None), (128, 3, 40), (300, 5, 60)]
)
def test_sample_indices_are_floyd_on_each_querys_splitmix64_stream(largest, start, length) -> None:
    """The picks, in order, of every query's stream (``(b·H + h)·length + start + i``) as the
    plain-Python reference draws them: whatever the kernel's grouping of the rows (16 at a
    time, in vector lanes up to 128 keys, one by one above) and whatever each row's count and
    population (all keys, none, one)."""
    gen = torch.Generator().manual_seed(largest + start)
    shape = (2, 3, 37)
    population = torch.randint(1, largest + 1, shape, generator=gen)
    population[0, 0, :4] = torch.tensor([1, largest, 64, 65])
    count = (torch.rand(shape, generator=gen) * (population + 1)).long().clamp_max(population)
    count[0, 0, :6] = torch.tensor([1, largest, 64, 0, 2, 5])
    count = count.minimum(population)
    seed = (1 << 64) - 12345
    ours = native.sample_indices(count, population, largest, seed, start=start, length=length)
    for b, h, i in ((b, h, i) for b in range(2) for h in range(3) for i in range(37)):
        c, n = int(count[b, h, i]), int(population[b, h, i])
        stream = (b * 3 + h) * (length or 37) + start + i
        assert ours[b, h, i, :c].tolist() == _floyd_stream_reference(seed, stream, c, n)
        assert not ours[b, h, i, c:].any()


def _attention_reference(
    q, k, v, kept: torch.Tensor, scale: float, n: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Softmax_n attention in float64 over the boolean support ``kept (..., L, S)``, with an
    additive ``bias (..., S)`` per key if given."""
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double().unsqueeze(-2).nan_to_num(neginf=0.0)
    z = scores.masked_fill(~kept, -math.inf)
    peak = z.amax(-1, keepdim=True).clamp_min(0 if n > 0 else -math.inf).nan_to_num(0, 0, 0)
    e = (z - peak).exp()
    weights = e / (n * (-peak).exp() + e.sum(-1, keepdim=True)).clamp_min(1e-300)
    return weights @ v.double()


def _causal_counts(length: int, size: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    population = (torch.arange(length) + size - length + 1).clamp(0, size)
    return population.clamp(max=k), population


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "length,size,k,chunk",
    [(9, 12, 3, 2048), (9, 12, 3, 4), (12, 9, 4, 2048), (5, 300, 40, 64), (7, 1500, 33, 512),
     (3, 2100, 64, 2048), (4, 6, 9, 2), (6, 100, 50, 2048), (5, 300, 40, 2048)],
)  # fmt: skip
@pytest.mark.parametrize("n", [0.0, 1.0])
def test_topk_attend_is_softmax_n_over_each_querys_top_k(dtype, length, size, k, chunk, n) -> None:
    """:func:`native.topk_attend` equals Softmax_n attention over each query's ``count`` largest
    visible scores (float64 reference): rows selected in one pass (narrow) and pushed in chunks
    (wide, or a small ``chunk``), causal counts with rows that see no key (zeros), counts above
    the visible keys; one-pass rows of 95 to 300 keys, whole vectors of keys and a rest, for
    the compress instructions of the compaction."""
    if not native.attention_available(torch.zeros(1, dtype=dtype)):
        pytest.skip("no BLAS product found")
    gen = torch.Generator().manual_seed(size)
    q, k_, v = (torch.randn(2, 3, m, 8, generator=gen, dtype=dtype) for m in (length, size, size))
    count, population = _causal_counts(length, size, k)
    out = native.topk_attend(q, k_, v, count, population, scale=0.6, n=n, chunk=chunk)
    scores = (q.double() @ k_.double().transpose(-1, -2)).masked_fill(
        torch.arange(size) >= population.unsqueeze(-1), -math.inf
    )
    top = scores.topk(min(k, size), dim=-1).indices
    ranks = torch.arange(min(k, size)).expand_as(top)
    kept = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, top, ranks < count.unsqueeze(-1))
    ref = _attention_reference(q, k_, v, kept, 0.6, n)
    tol = {"rtol": 2e-5, "atol": 2e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(out.double(), ref, **tol)


@pytest.mark.parametrize("chunk", [2, 4, 2048])
def test_topk_attend_keeps_the_first_ties_and_ranks_nan_largest(chunk) -> None:
    """Of tied scores the first columns are kept (as :func:`topk`), in one pass and in chunks;
    a NaN score is kept, so its query's output is NaN."""
    if not native.attention_available(torch.zeros(1)):
        pytest.skip("no BLAS product found")
    q = torch.ones(1, 1, 2, 2)
    k = torch.ones(1, 1, 6, 2)
    v = torch.arange(12.0).view(1, 1, 6, 2)
    count, population = torch.full((2,), 3), torch.full((2,), 6)
    out = native.topk_attend(q, k, v, count, population, scale=1.0, chunk=chunk)
    torch.testing.assert_close(out[0, 0], v[0, 0, :3].mean(0).expand(2, 2))
    k[0, 0, 4] = math.nan
    assert native.topk_attend(q, k, v, count, population, scale=1.0, chunk=chunk).isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0.0, 1.0])
@pytest.mark.parametrize("product", [True, False])
def test_sample_attend_weighs_sample_indices_subsets(dtype, n, product) -> None:
    """:func:`native.sample_attend` is Softmax_n attention over the subsets of
    :func:`native.sample_indices` (same seed, the whole call), causal counts included, with its
    scores from a product with all keys or from gathered dot products."""
    gen = torch.Generator().manual_seed(3)
    length, size = 11, 9
    q, k, v = (torch.randn(2, 3, m, 5, generator=gen, dtype=dtype) for m in (length, size, size))
    count, population = _causal_counts(length, size, 4)
    out = native.sample_attend(q, k, v, count, population, 77, scale=0.8, n=n, product=product)
    idx = native.sample_indices(
        count.expand(2, 3, length).contiguous(), population.expand(2, 3, length).contiguous(), 4, 77
    )
    slots = (torch.arange(4) < count.unsqueeze(-1)).long().expand_as(idx)
    # padding slots point at key 0 and keep nothing: added, not written over
    kept = torch.zeros(2, 3, length, size, dtype=torch.long).scatter_add(-1, idx, slots) > 0
    ref = _attention_reference(q, k, v, kept, 0.8, n)
    tol = {"rtol": 2e-5, "atol": 2e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(out.double(), ref, **tol)


def _key_mask_counts(length: int, size: int, k: int, dtype: torch.dtype):
    """A per-key bias ``(2, 3, S)`` (finite values, ``-inf`` on a random third of the keys, a
    batch-head without keys), its allowed keys in order, the causal prefix ``(L,)``, and per
    batch-head how many allowed keys each query sees and keeps ``(2, 3, L)``."""
    gen = torch.Generator().manual_seed(size + length)
    allowed = torch.rand(2, 3, size, generator=gen) > 0.35
    allowed[1, 2] = False
    bias = torch.randn(2, 3, size, generator=gen, dtype=dtype).masked_fill(~allowed, -math.inf)
    prefix = (torch.arange(length) + size - length + 1).clamp(0, size)
    valid = torch.nn.functional.pad(allowed.cumsum(-1), (1, 0))[..., prefix]
    keys = torch.argsort((~allowed).to(torch.uint8), dim=-1, stable=True)
    return bias, allowed, keys, prefix, valid, valid.clamp(max=k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length,size,k,chunk", [(9, 12, 3, 2048), (12, 9, 4, 4), (5, 300, 40, 64)])
def test_fused_kernels_take_a_bias_per_key_and_counts_per_batch_head(
    dtype, length, size, k, chunk
) -> None:
    """With an additive ``bias`` per key (``-inf``: excluded, whatever the score, NaN too) and
    counts per batch-head ``(..., L)``: :func:`native.topk_attend` keeps each query's largest
    biased scores among its allowed keys; :func:`native.sample_attend` with ``keys`` draws the
    :func:`native.sample_indices` subsets of the allowed keys (mapped through ``keys``), in
    product and dot modes; :func:`native.attend_backward` gives autograd's gradients (float64
    references); a batch-head without keys gives zeros."""
    if not native.attention_available(torch.zeros(1, dtype=dtype)):
        pytest.skip("no BLAS product found")
    gen = torch.Generator().manual_seed(length)
    q, k_, v = (torch.randn(2, 3, m, 8, generator=gen, dtype=dtype) for m in (length, size, size))
    bias, allowed, keys, prefix, valid, count = _key_mask_counts(length, size, k, dtype)
    k_[0, 0, ~allowed[0, 0]] = math.nan  # an excluded key's NaN score stays excluded
    visible = allowed.unsqueeze(-2) & (torch.arange(size) < prefix.unsqueeze(-1))
    tol = {"rtol": 2e-5, "atol": 2e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    slots = int(count.max())
    support = (
        torch.empty(2, 3, length, slots, dtype=torch.int64),
        torch.empty(2, 3, length, slots, dtype=dtype),
    )
    out = native.topk_attend(
        q, k_, v, count, prefix, scale=0.6, n=1.0, chunk=chunk, bias=bias, support=support
    )
    finite_k = k_.nan_to_num(0.0)
    scores = (q.double() @ finite_k.double().transpose(-1, -2)) * 0.6 + bias.double().unsqueeze(-2)
    top = scores.masked_fill(~visible, -math.inf).topk(min(k, size), dim=-1).indices
    ranks = torch.arange(min(k, size)).expand_as(top)
    kept = torch.zeros_like(visible).scatter(-1, top, ranks < count.unsqueeze(-1))
    ref = _attention_reference(q, finite_k, v, kept, 0.6, 1.0, bias)
    torch.testing.assert_close(out.double(), ref, **tol)
    assert not out[1, 2].any()
    grad = torch.randn(out.shape, generator=gen, dtype=dtype)
    inputs = [t.double().requires_grad_() for t in (q, finite_k, v)]
    expected = torch.autograd.grad(
        _attention_reference(*inputs, kept, 0.6, 1.0, bias), inputs, grad.double()
    )
    for product in (True, False):
        ours = native.attend_backward(
            q, finite_k, v, support, count, grad, scale=0.6, product=product
        )
        for got, want in zip(ours, expected, strict=True):
            torch.testing.assert_close(got.double(), want, rtol=tol["rtol"], atol=10 * tol["atol"])
    q, k_ = q.nan_to_num(0.0), finite_k
    drawn = native.sample_indices(count, valid, slots, 9)
    mapped = keys.gather(-1, drawn.view(2, 3, -1)).view(drawn.shape)
    marks = (torch.arange(slots) < count.unsqueeze(-1)).long()
    kept = torch.zeros(2, 3, length, size, dtype=torch.long).scatter_add(-1, mapped, marks) > 0
    assert not (kept & ~visible).any() and torch.equal(kept.sum(-1), count)
    ref = _attention_reference(q, k_, v, kept, 0.6, 1.0, bias)
    for product in (True, False):
        out = native.sample_attend(
            q, k_, v, count, valid, 9, scale=0.6, n=1.0, product=product, bias=bias, keys=keys
        )
        torch.testing.assert_close(out.double(), ref, **tol)


def test_fused_attention_kernels_reject_bad_arguments() -> None:
    """Counts outside ``0 <= count <= population <= S``, counts of the wrong shape, mismatched
    shapes or dtypes and bad seeds are refused with errors that name them."""
    q, k, v = torch.randn(2, 4, 3), torch.randn(2, 5, 3), torch.randn(2, 5, 2)
    good = torch.full((4,), 2), torch.full((4,), 5)
    calls = [lambda c, p: native.sample_attend(q, k, v, c, p, 1, scale=1.0)]
    if native.attention_available(q):
        calls.append(lambda c, p: native.topk_attend(q, k, v, c, p, scale=1.0))
    for call in calls:
        for count, population in (
            (torch.full((4,), 6), torch.full((4,), 6)),  # population above S
            (torch.full((4,), 3), torch.full((4,), 2)),  # count above population
            (torch.full((4,), -1), good[1]),
        ):
            with pytest.raises(ValueError, match="count and population"):
                call(count, population)
        with pytest.raises(ValueError, match="count must hold one integer per query"):
            call(torch.full((3,), 2), good[1])
        with pytest.raises(TypeError, match="population must hold integers"):
            call(good[0], good[1].double())
    with pytest.raises(ValueError, match="leading shape"):
        native.sample_attend(q, k[:1], v[:1], *good, 1, scale=1.0)
    with pytest.raises(ValueError, match="k must have at least 2 dimensions, got 1"):
        native.sample_attend(q, k[0, 0], v, *good, 1, scale=1.0)
    with pytest.raises(ValueError, match="same S keys"):
        native.sample_attend(q, k, v[:, :4], *good, 1, scale=1.0)
    with pytest.raises(TypeError, match=r"v must be torch\.float32"):
        native.sample_attend(q, k, v.double(), *good, 1, scale=1.0)
    with pytest.raises(ValueError, match="seed"):
        native.sample_attend(q, k, v, *good, -1, scale=1.0)
    with pytest.raises(ValueError, match=r"bias must hold one entry per key of each batch-head"):
        native.sample_attend(q, k, v, *good, 1, scale=1.0, bias=torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"bias must be torch\.float32"):
        native.sample_attend(q, k, v, *good, 1, scale=1.0, bias=torch.zeros(2, 5).double())
    with pytest.raises(ValueError, match=r"keys must hold indices in \[0, 5\)"):
        native.sample_attend(q, k, v, *good, 1, scale=1.0, keys=torch.full((2, 5), 5))
    with pytest.raises(
        ValueError, match=r"count must hold one integer per query, \(4,\) or \(2, 4\)"
    ):
        native.sample_attend(q, k, v, torch.full((3, 4), 2), good[1], 1, scale=1.0)


def test_fused_attention_of_empty_calls_and_without_blas(monkeypatch) -> None:
    """No queries, no keys or no batch give empty or zero outputs; without a BLAS product
    :func:`native.attention_available` is False and :func:`native.topk_attend` says why."""
    for lead, length, size in (((2,), 0, 5), ((2,), 3, 0), ((0,), 3, 5)):
        q, k, v = (
            torch.randn(*lead, length, 4),
            torch.randn(*lead, size, 4),
            torch.randn(*lead, size, 2),
        )
        count = torch.zeros(length, dtype=torch.int64)
        population = torch.full((length,), size)
        out = native.sample_attend(q, k, v, count, population, 0, scale=1.0)
        assert out.shape == (*lead, length, 2) and not out.any()
        if native.attention_available(q):
            out = native.topk_attend(q, k, v, count, population, scale=1.0)
            assert out.shape == (*lead, length, 2) and not out.any()
    monkeypatch.setattr(native, "_blas", lambda dtype: None)
    assert not native.attention_available(torch.zeros(1))
    with pytest.raises(RuntimeError, match="no BLAS product"):
        native.topk_attend(q, k, v, count, population, scale=1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("product", [True, False])
@pytest.mark.parametrize("length,size,k", [(9, 40, 7), (12, 9, 4), (3, 5, 9)])
def test_attend_backward_is_the_gradient_over_the_saved_support(
    dtype, product, length, size, k
) -> None:
    """:func:`native.attend_backward` gives autograd's gradients of Softmax_n attention over the
    support that :func:`native.topk_attend` saved (float64 reference), with dense products and
    per kept key, causal counts with rows that keep nothing, and a ValueError for a bad index."""
    if not native.attention_available(torch.zeros(1, dtype=dtype)):
        pytest.skip("no BLAS product found")
    gen = torch.Generator().manual_seed(length)
    q, k_, v = (torch.randn(2, 3, m, d, generator=gen, dtype=dtype) for m, d in
                ((length, 8), (size, 8), (size, 5)))  # fmt: skip
    count, population = _causal_counts(length, size, k)
    slots = int(count.max())
    idx = torch.empty(2, 3, length, slots, dtype=torch.int64)
    weights = torch.empty(2, 3, length, slots, dtype=dtype)
    out = native.topk_attend(q, k_, v, count, population, scale=0.6, n=1.0, support=(idx, weights))
    grad = torch.randn(out.shape, generator=gen, dtype=dtype)
    ours = native.attend_backward(q, k_, v, (idx, weights), count, grad, scale=0.6, product=product)
    inputs = [t.double().requires_grad_() for t in (q, k_, v)]
    marks = (torch.arange(slots) < count.unsqueeze(-1)).long().expand_as(idx)
    kept = torch.zeros(2, 3, length, size, dtype=torch.long).scatter_add(-1, idx, marks) > 0
    ref = _attention_reference(*inputs, kept, 0.6, 1.0)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    expected = torch.autograd.grad(ref, inputs, grad.double())
    tol = {"rtol": 2e-5, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got.double(), want, **tol)
    idx[0, 0, -1, 0] = size
    with pytest.raises(ValueError, match="support idx"):
        native.attend_backward(q, k_, v, (idx, weights), count, grad, scale=0.6)
