"""benchmarks/bench_peers.py: the busy processes of ``--load``, the record of ``--out`` and the
README section rendered from a record (issue 31)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _module() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # its sibling modules (_timing, bench_core, ...)
    try:
        spec = importlib.util.spec_from_file_location("bench_peers", BENCHMARKS / "bench_peers.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


bench_peers = _module()


def test_busy_processes_run_inside_and_are_reaped_after_an_error() -> None:
    with pytest.raises(RuntimeError, match="inside"), bench_peers.busy_processes(2) as spinners:
        assert len(spinners) == 2
        assert all(spinner.poll() is None for spinner in spinners)  # spinning
        raise RuntimeError("inside")
    assert all(spinner.returncode is not None for spinner in spinners)  # killed and reaped
    with pytest.raises(ValueError, match="load"), bench_peers.busy_processes(-1):
        pass


def _smoke_record(tmp_path: Path) -> Path:
    """A record of one tiny measured row, written as ``--out`` writes it."""
    row = bench_peers.ratio_row("tiny", lambda: sum(range(50)), lambda: sum(range(10)), 3,
                                target=1.1, peer="a loop")  # fmt: skip
    record = bench_peers.record_of([row], [], threads=2, load=1)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    return path


def test_render_replaces_only_the_marked_readme_section(tmp_path: Path) -> None:
    record = _smoke_record(tmp_path)
    readme = tmp_path / "README.md"
    before, after = "# Title\n\ntext before\n\n", "\n\ntext after\n"
    readme.write_text(f"{before}{bench_peers.BEGIN}\nold table\n{bench_peers.END}{after}")
    section = bench_peers.render_into(record, readme)
    text = readme.read_text()
    assert text == before + section + after
    assert "old table" not in text
    assert "| tiny | a loop |" in section and "≤ 1.1" in section
    assert "2 threads" in section and "beside 1 busy processes" in section
    assert bench_peers.render_into(record, None) == section  # printing changes nothing


def test_render_refuses_a_readme_without_markers_and_a_foreign_record(tmp_path: Path) -> None:
    record = _smoke_record(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("no section here\n")
    with pytest.raises(ValueError, match="bench_peers:begin"):
        bench_peers.render_into(record, readme)
    assert readme.read_text() == "no section here\n"
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="'date'"):
        bench_peers.render_into(foreign, None)


def test_the_readme_speed_table_is_rendered_from_the_committed_record() -> None:
    record = json.loads((BENCHMARKS / "records" / "bench_peers.json").read_text())
    section = bench_peers.render_section(record)
    assert section in (ROOT / "README.md").read_text(), (
        "README.md's bench_peers section differs from benchmarks/records/bench_peers.json: "
        "python benchmarks/bench_peers.py --render benchmarks/records/bench_peers.json "
        "--readme README.md"
    )


def test_the_memory_rows_become_one_sentence(tmp_path: Path) -> None:
    record = json.loads(_smoke_record(tmp_path).read_text())
    record["memory"] = [
        {"model": m, "length": 16384, "heads": 1, "dim": 64, "backward": b, "growth_mib": g}
        for m, b, g in [("sparsemax", False, 124.4), ("sparsemax", True, 137.4),
                        ("topk64", False, 72.3), ("topk64", True, 80.3)]
    ]  # fmt: skip
    section = bench_peers.render_section(record)
    assert "L = S = 16384 (B 1, H 1, E 64" in section
    assert "sparsemax 124 / 137 MiB (fwd / fwd+bwd); topk64 72 / 80 MiB" in section


def test_the_plain_random_feature_peer_computes_what_random_features_compute() -> None:
    """The equal-arithmetic peer of the random-feature rows gives our output and gradients
    (float64), so its time is the time of the same computation; a wrong scale would not."""
    import torch

    from hopfield.functional import associate
    from hopfield.functional.efficient_kernel import RandomFeatures

    gen = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(2, 3, 40, 16, dtype=torch.float64, generator=gen).requires_grad_()
        for _ in range(3)
    )
    structure = RandomFeatures(seed=1, dtype=torch.float64)
    ours = associate(q, k, v, structure=structure)
    assert isinstance(ours, torch.Tensor) and structure.projection is not None
    peer = bench_peers.plain_random_features(q, k, v, structure.projection)
    torch.testing.assert_close(peer, ours, rtol=1e-10, atol=1e-12)
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=gen)
    grads = torch.autograd.grad((ours * weights).sum(), (q, k, v))
    peer_grads = torch.autograd.grad((peer * weights).sum(), (q, k, v))
    for got, expected in zip(peer_grads, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-11)
    wrong = bench_peers.plain_random_features(q * 2, k, v, structure.projection)
    assert not torch.allclose(wrong, ours, rtol=1e-3)


def _row(name: str, ratio: float) -> dict[str, object]:
    return {"row": name, "ratio": ratio, "spread": [ratio, ratio], "ours_s": ratio, "peer_s": 1.0,
            "target": 1.05, "peer": "a loop"}  # fmt: skip


def test_rows_of_several_processes_merge_into_their_median_and_range() -> None:
    runs = [[_row("a", 1.09), _row("b", 0.5)], [_row("a", 1.02), _row("b", 0.7)],
            [_row("a", 1.03), _row("b", 0.6)]]  # fmt: skip
    first, second = bench_peers.merged_rows(runs)
    assert (first["row"], first["ratio"], first["spread"]) == ("a", 1.03, [1.02, 1.09])
    assert first["process_ratios"] == [1.09, 1.02, 1.03]
    assert (second["ratio"], second["spread"], second["ours_s"]) == (0.6, [0.5, 0.7], 0.6)
    with pytest.raises(ValueError, match="different rows"):
        bench_peers.merged_rows([[_row("a", 1.0)], [_row("b", 1.0)]])
    with pytest.raises(ValueError, match="at least one process"):
        bench_peers.merged_rows([])


def test_a_record_of_several_processes_says_so_in_the_readme_section() -> None:
    rows = bench_peers.merged_rows([[_row("a", 1.09)], [_row("a", 1.02)], [_row("a", 1.03)]])
    record = bench_peers.record_of(rows, [], threads=2, load=2, processes=3)
    section = bench_peers.render_section(record)
    assert "`python benchmarks/bench_peers.py --processes 3`" in section
    assert "ours ÷ baseline (median of 3 processes [lowest, highest])" in section
    assert "| a | a loop | 1.03 [1.02, 1.09] | ≤ 1.05 | yes |" in section
    single = bench_peers.render_section(bench_peers.record_of(rows, [], threads=2, load=2))
    assert "(median [q25, q75])" in single and "--processes" not in single


def test_processes_below_one_are_refused(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--processes", "0"])
    with pytest.raises(SystemExit):
        bench_peers.main()
    assert "--processes must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["--quick", "--repeats=3", "--threads", "1", "--load=2", "--only", "conditions"]],
)
def test_every_process_gets_the_measurement_options_it_was_started_with(argv: list[str]) -> None:
    """run_processes hands each process the measurement options of the parent: parsed again,
    the flags give the same values, and none of the parent's own options (processes, out)."""
    parser = bench_peers.parser_of_options()
    parent = parser.parse_args([*argv, "--processes", "3", "--out", "record.json", "--memory"])
    flags = bench_peers.measurement_flags(parent)
    child = parser.parse_args(flags)
    for flag in bench_peers.MEASUREMENT_OPTIONS:
        name = flag.removeprefix("--")
        assert getattr(child, name) == getattr(parent, name), name
    assert (child.processes, child.out, child.memory) == (1, None, False)
    assert ("--quick" in flags) == ("--quick" in argv)


def test_short_calls_get_more_timed_pairs_up_to_a_cap() -> None:
    import _timing

    assert _timing.pairs_for(7, 1.0) == 7  # long calls: the repeats asked for
    assert _timing.pairs_for(7, 0.01) == 50  # 0.5 s of 10 ms pairs
    assert _timing.pairs_for(7, 1e-6) == _timing.MOST_PAIRS
    assert _timing.pairs_for(7, 0.0) == 7  # no warm pair timed
    calls = []
    _timing.interleaved_ratios(lambda: calls.append("a"), lambda: calls.append("b"), 3)
    assert len(calls) == 2 * (1 + _timing.MOST_PAIRS)  # one warm pair, then the cap
    calls.clear()
    _timing.interleaved_ratios(lambda: calls.append("a"), lambda: calls.append("b"), 3, warmup=0)
    assert calls == ["a", "b"] * 3
