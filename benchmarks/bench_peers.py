"""Issue 16's speed table in one run: every efficient structure against the dense kernel or the
peer library it is meant to beat.

Each row times ours and its baseline in turn in one process and reports the median of the
per-pair ratios ours ÷ baseline, with their quartiles, beside the issue's target (reported, not
asserted). The rows come from

- ``peers_separation``: ``Sparsemax``, ``Entmax(1.5)`` and learnable-α ``Entmax`` ÷ the
  ``entmax`` package (8192 and 32768 rows × 1024 keys, forward + backward);
- ``peers_sparse_attention``: ``TopK(64)``, ``RandomMask(64)`` and ``RandomFeatures`` attention
  ÷ ``scaled_dot_product_attention`` (B 1, H 8, E 64, N = 1k … 8k);
- this file: one step of ``hopfield.memory.retrieve`` with its defaults ÷ ``softmax(βQMᵀ)M``
  (10 000 × 10 000, d 784);
- ``peers_hyperset``: one Hyper-SET iteration ÷ ``nn.TransformerEncoderLayer`` (B 4, N 1024,
  d 256, forward + backward);
- with ``--memory``: the peak resident-memory growth of sparsemax and Top-K(64) attention at
  N = 16k (``bench_efficient.sparse_memory``, one subprocess per case).

Issue 31 adds the rows where users lose at other sizes and conditions (``conditions_rows``):
every structure at N = 128 … 512 ÷ SDPA (target 1.1), Top-K(64) and random masks on a batch of
padded sequences at N = 128 and 512 ÷ SDPA with the same padding mask (target 1.1), random
features at head size 128 and
batch 8, ``retrieve`` with few queries (target 1.05), the ``Hopfield`` layer at batch 1 ÷
``nn.MultiheadAttention`` (target 1.1), ``Entmax(1.5)`` on flat rows and 1024 × 128 inputs
(target 0.9), and, with ``--load N``, Top-K(64) and random-mask forward at N = 2k while ``N``
busy processes run (:func:`busy_processes`; targets 1.5 and 1, measured under the same load).

Run from the repository root (``--quick``: smaller sizes, for a smoke test):

    python benchmarks/bench_peers.py [--quick] [--repeats 7] [--threads 2] [--memory]
        [--load 2] [--processes 3] [--out record.json] [--markdown]
    python benchmarks/bench_peers.py --render record.json [--readme README.md]

``--processes K`` measures every row in K fresh processes, one after another, and reports the
median of their median ratios with the lowest and highest (:func:`merged_rows`): timings differ
more between processes than within one, so one process's quartiles understate the spread.

``--out`` writes a record of the run (rows, threads, load, date, machine, software); ``--render``
prints the README's speed section from such a record, or with ``--readme`` replaces the section
between the markers ``<!-- bench_peers:begin -->`` and ``<!-- bench_peers:end -->`` in that file.
Render the README only from a record measured on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from _timing import ROW_HEADER, format_row, ratio_row, timed_pass
from bench_core import retrieve_case
from bench_efficient import sparse_memory

RETRIEVE_TARGET = 1.15
SMALL_TARGET = 1.1  # issue 31, item 2: every structure at N >= 128 ÷ the dense path
BEGIN, END = "<!-- bench_peers:begin -->", "<!-- bench_peers:end -->"


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes that spin on a core each while the block runs; they are killed and
    reaped on the way out, also when the block raises or is interrupted."""
    if count < 0:
        raise ValueError(f"the load must be a number of processes >= 0, got {count}")
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def _attention_row(
    model: str,
    n: int,
    backward: bool,
    repeats: int,
    target: float,
    batch: int = 1,
    padded: bool = False,
    **fields: object,
) -> dict[str, Any]:
    import peers_sparse_attention

    ours, sdpa = peers_sparse_attention.case(model, n, backward, batch=batch, padded=padded)
    label = f"{model} N={n} {'fwd+bwd' if backward else 'fwd'}"
    label += "".join(f" {key} {value}" for key, value in fields.items())
    if padded:
        label += f", B {batch} padded"
        fields = {"batch": batch, "padded": True, **fields}
    return ratio_row(
        label, ours, sdpa, repeats, target=target, peer="dense SDPA", model=model, n=n,
        backward=backward, **fields,
    )  # fmt: skip


def small_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Every structure at small N ÷ SDPA (issue 31, item 2)."""
    import peers_sparse_attention

    sizes = [128, 256] if quick else [128, 256, 512]
    return [
        _attention_row(model, n, backward, repeats, SMALL_TARGET)
        for model in peers_sparse_attention.MODELS
        for n in sizes
        for backward in (False, True)
    ]


def padded_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Top-K(64) and random masks on a batch of padded sequences (B 4, lengths N, N/2, N, N/4,
    the same padding mask for SDPA) ÷ SDPA: the small-N target of issue 31, item 2, for calls with
    a padding mask (MIL bags, sentences of several lengths)."""
    sizes = [128] if quick else [128, 512]
    return [
        _attention_row(model, n, backward, repeats, SMALL_TARGET, batch=4, padded=True)
        for model in ("TopK(64)", "RandomMask(64)")
        for n in sizes
        for backward in (False, True)
    ]


def loaded_rows(repeats: int, quick: bool, load: int) -> list[dict[str, Any]]:
    """Top-K(64) and random-mask forward at N = 2k ÷ SDPA while ``load`` busy processes run
    (issue 31, item 1); both sides are timed under the same load."""
    n = 512 if quick else 2048
    targets = {"TopK(64)": 1.5, "RandomMask(64)": 1.0}
    with busy_processes(load):
        return [
            _attention_row(model, n, False, repeats, target, load=load)
            for model, target in targets.items()
        ]


def random_feature_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Random features at head size 128 and at batch 8 ÷ SDPA (issue 31, item 3)."""
    from hopfield.functional import associate
    from hopfield.functional.efficient_kernel import RandomFeatures

    n = 512 if quick else 2048
    out = []
    for batch, dim in ((1, 128), (8, 64)):
        gen = torch.Generator().manual_seed(batch * dim)
        q, k, v = (torch.randn(batch, 8, n, dim, generator=gen) for _ in range(3))
        structure = RandomFeatures(seed=0)
        with torch.no_grad():
            out.append(
                ratio_row(
                    f"RandomFeatures N={n} B={batch} E={dim} fwd",
                    lambda: associate(q, k, v, structure=structure),  # noqa: B023
                    lambda: F.scaled_dot_product_attention(q, k, v),  # noqa: B023
                    repeats,
                    target=1.0,
                    peer="dense SDPA",
                    n=n,
                    batch=batch,
                    dim=dim,
                )
            )
    return out


def plain_random_features(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor
) -> torch.Tensor:
    """Positive-random-feature attention ``(B, H, N, E)`` written out in plain torch, the peer of
    equal arithmetic for ``RandomFeatures()`` (softmax kernel, no mask, ``β = 1/√E``): the two
    projections onto ``projection (m, E)``, their exponentials, ``φ(K)ᵀV``, ``φ(Q)(φ(K)ᵀV)`` and the
    normaliser. The per-query and per-head shifts cancel in the normalisation."""
    root = q.shape[-1] ** -0.25  # √β
    mapped_q = (q * root) @ projection.T
    phi_q = torch.exp(mapped_q - mapped_q.amax(-1, keepdim=True).detach())
    scaled_k = k * root
    logits_k = scaled_k @ projection.T - 0.5 * (scaled_k * scaled_k).sum(-1, keepdim=True)
    phi_k = torch.exp(logits_k - logits_k.amax(dim=(-2, -1), keepdim=True).detach())
    numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)
    return numerator / (phi_q @ phi_k.sum(-2).unsqueeze(-1))


def random_feature_arithmetic_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """Random features at N = 128 … 512 ÷ :func:`plain_random_features` on the same projection.

    The small-N rows of :func:`small_rows` compare random features with exact attention, whose
    arithmetic is smaller there: the features cost ``4·N·m·E`` multiply-adds (two projections and
    two products, ``m = E ln E = 266`` at ``E = 64``), exact attention ``2·N²·E``, a ratio of
    ``2m/N`` (4.2 at N = 128, 1.04 at 512). These rows show how much of the loss is ours rather
    than the model's: the target is the small-N 1.1 against the same arithmetic."""
    from hopfield.functional import associate
    from hopfield.functional.efficient_kernel import RandomFeatures

    rows: list[dict[str, Any]] = []
    for n in [128, 256] if quick else [128, 256, 512]:
        for backward in (False, True):
            gen = torch.Generator().manual_seed(n)
            q, k, v = (
                torch.randn(1, 8, n, 64, generator=gen).requires_grad_(backward) for _ in range(3)
            )
            structure = RandomFeatures(seed=0)
            structure.reset_parameters(64)
            projection = structure.projection
            assert projection is not None

            def ours() -> torch.Tensor:
                out = associate(q, k, v, structure=structure)  # noqa: B023
                assert isinstance(out, torch.Tensor)
                return out

            rows.append(
                ratio_row(
                    f"RandomFeatures N={n} {'fwd+bwd' if backward else 'fwd'}, same arithmetic",
                    timed_pass(ours, backward),
                    timed_pass(lambda: plain_random_features(q, k, v, projection), backward),  # noqa: B023
                    repeats,
                    target=SMALL_TARGET,
                    peer="the same features in plain torch",
                    n=n,
                    backward=backward,
                    arithmetic_vs_exact=2 * projection.shape[0] / n,
                )
            )
    return rows


def few_query_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """``retrieve`` (one step, defaults) with few queries ÷ the plain formula (issue 31, item 6)."""
    from hopfield.functional import Softmax
    from hopfield.memory import retrieve

    size = 2000 if quick else 10_000
    gen = torch.Generator().manual_seed(0)
    memories = torch.rand(size, 784, generator=gen)
    beta = 1.0 / 784
    out = []
    with torch.inference_mode():
        for count in (1, 10, 100, 600):
            queries = torch.rand(count, 784, generator=gen)
            out.append(
                ratio_row(
                    f"retrieve {count} x {size}, d 784",
                    lambda: retrieve(queries, memories, Softmax(), beta=beta),  # noqa: B023
                    lambda: torch.softmax(beta * queries @ memories.T, -1) @ memories,  # noqa: B023
                    repeats,
                    target=1.05,
                    peer="softmax(βQMᵀ)M",
                    queries=count,
                )
            )
    return out


def layer_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """The ``Hopfield`` layer at batch 1 ÷ ``nn.MultiheadAttention`` (issue 31, item 7)."""
    from hopfield.nn import Hopfield

    torch.manual_seed(0)
    x = torch.randn(1, 256, 64)
    ours = Hopfield(64, num_heads=1, batch_first=True).eval()
    peer = torch.nn.MultiheadAttention(64, 1, batch_first=True).eval()
    with torch.no_grad():
        row = ratio_row(
            "Hopfield layer B=1 N=256 width 64, 1 head, fwd",
            lambda: ours(x),
            lambda: peer(x, x, x, need_weights=False),
            max(repeats, 50),  # 0.3 ms a call: more pairs for a steady median
            target=1.1,
            peer="nn.MultiheadAttention",
        )
    return [row]


def entmax_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """``Entmax(1.5)`` ÷ ``entmax.entmax15`` on flat rows and on 1024 × 128 inputs (issue 31,
    item 5)."""
    import entmax as peer

    from hopfield.functional.separation import Entmax

    rows_count = 1024 if quick else 8192
    gen = torch.Generator().manual_seed(5)
    inputs = {
        f"flat {rows_count}x1024": 1e-3 * torch.randn(rows_count, 1024, generator=gen),
        "1024x128": torch.randn(1024, 128, generator=gen),
    }
    ours_map = Entmax(1.5)
    out = []
    for label, x in inputs.items():
        scores = x.requires_grad_(True)

        def run(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
            def call() -> object:
                scores.grad = None  # noqa: B023
                fn(scores).sum().backward()  # noqa: B023
                return scores.grad  # noqa: B023

            return call

        out.append(
            ratio_row(
                f"Entmax(1.5) {label} fwd+bwd",
                run(ours_map),
                run(lambda s: peer.entmax15(s, dim=-1)),
                repeats,
                target=0.9,
                peer="entmax.entmax15",
            )
        )
    return out


def conditions_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """The rows of issue 31 that need no background load."""
    return [
        *small_rows(repeats, quick),
        *padded_rows(repeats, quick),
        *random_feature_rows(repeats, quick),
        *random_feature_arithmetic_rows(repeats, quick),
        *few_query_rows(repeats, quick),
        *layer_rows(repeats, quick),
        *entmax_rows(repeats, quick),
    ]


def retrieve_rows(repeats: int, quick: bool) -> list[dict[str, Any]]:
    """``retrieve`` (one step, defaults) ÷ the plain formula, on the same inputs."""
    n = 2000 if quick else 10_000
    with torch.inference_mode():
        row = ratio_row(
            f"retrieve defaults, {n} x {n}, d 784",
            retrieve_case("retrieve", n),
            retrieve_case("plain", n),
            repeats,
            target=RETRIEVE_TARGET,
            peer="softmax(βQMᵀ)M",
        )
    return [row]


def row_sources() -> list[tuple[str, Callable[[int, bool], list[dict[str, Any]]]]]:
    """The row-producing functions, in the order of the issue's table."""
    import peers_hyperset
    import peers_separation
    import peers_sparse_attention

    return [
        ("separation", peers_separation.rows),
        ("sparse attention", peers_sparse_attention.rows),
        ("retrieve", retrieve_rows),
        ("Hyper-SET", peers_hyperset.rows),
        ("other sizes and conditions", conditions_rows),
    ]


def merged_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several processes' runs, one row each: its ``ratio`` the median of the
    processes' median ratios, its ``spread`` their ``[lowest, highest]``, ``process_ratios``
    each process's median, ``ours_s`` and ``peer_s`` the medians of the processes' medians.

    Timings on one machine differ between processes more than within one (allocator state,
    memory placement, thread placement: ``retrieve`` with 100 queries 1.02–1.09 in five runs
    of 28–29 Nov, each with quartiles 0.01 apart), so the process is the replicate.
    """
    if not runs:
        raise ValueError("runs is empty: merge the rows of at least one process")
    names = [[row["row"] for row in rows] for rows in runs]
    if any(order != names[0] for order in names[1:]):
        raise ValueError(f"the processes measured different rows: {names}")
    merged = []
    for rows in zip(*runs, strict=True):
        ratios = [row["ratio"] for row in rows]
        merged.append(
            {
                **rows[0],
                "ratio": statistics.median(ratios),
                "spread": [min(ratios), max(ratios)],
                "process_ratios": ratios,
                "ours_s": statistics.median(row["ours_s"] for row in rows),
                "peer_s": statistics.median(row["peer_s"] for row in rows),
            }
        )
    return merged


#: The options that say what a process measures and how: :func:`run_processes` hands each of
#: them to every process it starts, so a new one added here reaches them too.
MEASUREMENT_OPTIONS: dict[str, dict[str, Any]] = {
    "--quick": {"action": "store_true", "help": "smaller sizes, a smoke test"},
    "--repeats": {"type": int, "default": 7, "help": "timed pairs per row"},
    "--threads": {"type": int, "default": 2, "help": "torch.set_num_threads"},
    "--load": {"type": int, "default": 0, "help": "busy processes for the loaded rows"},
    "--only": {"choices": ["conditions"], "default": None, "help": "only these rows"},
}


def measurement_flags(args: argparse.Namespace) -> list[str]:
    """``args``' values of :data:`MEASUREMENT_OPTIONS` as command-line flags (a switch when
    on, ``--name=value`` when set)."""
    flags = []
    for flag, spec in MEASUREMENT_OPTIONS.items():
        value = getattr(args, flag.removeprefix("--"))
        if spec.get("action") == "store_true":
            flags += [flag] if value else []
        elif value is not None:
            flags.append(f"{flag}={value}")
    return flags


def run_processes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of ``args.processes`` runs of this file, one fresh process after another, each
    with ``args``' :func:`measurement_flags`, merged by :func:`merged_rows`."""
    flags = measurement_flags(args)
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.processes):
            out = Path(folder) / f"process-{index}.json"
            print(f"== process {index + 1} of {args.processes}", flush=True)
            command = [sys.executable, __file__, *flags, "--processes", "1", "--out", str(out)]
            subprocess.run(command, check=True)
            runs.append(json.loads(out.read_text())["rows"])
    return merged_rows(runs)


def markdown(rows: list[dict[str, Any]], processes: int = 1) -> str:
    """The rows as the README's speed table (the columns' statistics named after
    ``processes``, see :func:`merged_rows`)."""
    statistic = (
        "median [q25, q75]"
        if processes == 1
        else f"median of {processes} processes [lowest, highest]"
    )
    lines = [
        f"| measurement | baseline | ours ÷ baseline ({statistic}) | target | met |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        low, high = row["spread"]
        target, met = "—", "—"  # no target at this size
        if math.isfinite(row["target"]):
            target = f"≤ {row['target']:g}"
            met = "yes" if row["ratio"] <= row["target"] else "**no**"
        lines.append(
            f"| {row['row']} | {row['peer']} | {row['ratio']:.2f} [{low:.2f}, {high:.2f}] "
            f"| {target} | {met} |"
        )
    return "\n".join(lines)


def record_of(
    rows: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    threads: int,
    load: int,
    processes: int = 1,
) -> dict[str, Any]:
    """A run's record: its rows and the conditions they were measured under."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": threads,
        "load": load,
        "processes": processes,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "rows": rows,
        "memory": memory,
    }


def render_section(record: dict[str, Any]) -> str:
    """The README's speed section (between the markers) from a record of :func:`record_of`."""
    for key in ("date", "threads", "load", "rows"):
        if key not in record:
            raise ValueError(f"the record has no {key!r}: is it a bench_peers.py --out record?")
    average = record.get("load_average")
    busy = "" if not average else f", load average {average[0]:.1f} at the end"
    processes = int(record.get("processes", 1))
    command = "python benchmarks/bench_peers.py" + (f" --processes {processes}" * (processes > 1))
    lines = [
        BEGIN,
        f"Measured {record['date'][:10]} with `{command}` "
        f"({record['threads']} threads, torch {record.get('torch', '?')}, "
        f"{record.get('cpus', '?')} CPUs{busy}; the loaded rows ran beside "
        f"{record['load']} busy processes).",
        "",
        markdown(record["rows"], processes),
        *_memory_lines(record.get("memory") or []),
        END,
    ]
    return "\n".join(lines)


def _memory_lines(memory: list[dict[str, Any]]) -> list[str]:
    """A sentence on the ``--memory`` rows (peak resident-memory growth), if the record has
    them."""
    if not memory:
        return []
    parts = []
    for model in dict.fromkeys(str(row["model"]) for row in memory):
        rows = [r for r in memory if r["model"] == model]
        growth = " / ".join(f"{float(r['growth_mib']):.0f}" for r in rows)
        passes = " / ".join("fwd+bwd" if r["backward"] else "fwd" for r in rows)
        parts.append(f"{model} {growth} MiB ({passes})")
    first = memory[0]
    return [
        "",
        f"Peak resident-memory growth at L = S = {first['length']} (B 1, H {first['heads']}, "
        f"E {first['dim']}, one subprocess per case): " + "; ".join(parts) + ".",
    ]


def render_into(record_path: Path, readme: Path | None) -> str:
    """:func:`render_section` of the record at ``record_path``; with ``readme``, also written
    over the section between the markers of that file."""
    record = json.loads(record_path.read_text())
    section = render_section(record)
    if readme is None:
        return section
    text = readme.read_text()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"{readme} has no {BEGIN} ... {END} section to replace")
    readme.write_text(text[:begin] + section + text[end + len(END) :])
    return section


def parser_of_options() -> argparse.ArgumentParser:
    """This file's command line: :data:`MEASUREMENT_OPTIONS`, then the run's own options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, spec in MEASUREMENT_OPTIONS.items():
        parser.add_argument(flag, **spec)
    parser.add_argument("--memory", action="store_true", help="also the 16k peak-memory rows")
    parser.add_argument(
        "--processes", type=int, default=1, help="fresh processes, one after another (merged)"
    )
    parser.add_argument("--out", "--json", dest="out", default=None, help="write the record here")
    parser.add_argument("--markdown", action="store_true", help="print the README table")
    parser.add_argument("--render", default=None, help="a record to render the README section of")
    parser.add_argument("--readme", default=None, help="with --render: the file to update")
    return parser


def main() -> None:
    parser = parser_of_options()
    args = parser.parse_args()
    if args.render:
        print(render_into(Path(args.render), Path(args.readme) if args.readme else None))
        return
    if args.load < 0:
        parser.error(f"--load must be >= 0, got {args.load}")
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    torch.set_num_threads(args.threads)
    if args.processes > 1:
        rows = run_processes(args)
        print(f"== median of {args.processes} processes [lowest, highest]\n{ROW_HEADER}")
        print("\n".join(format_row(row) for row in rows), flush=True)
    else:
        rows = measured_rows(args)
    memory = sparse_memory([16384], [1], 64, args.threads) if args.memory else []
    if args.markdown:
        print("\n" + markdown(rows, args.processes))
    if args.out:
        record = record_of(rows, memory, args.threads, args.load, args.processes)
        Path(args.out).write_text(json.dumps(record, indent=2))


def measured_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows this process measures, printed as they come."""
    sources = row_sources()
    if args.only == "conditions":
        sources = [pair for pair in sources if pair[1] is conditions_rows]
    if args.load:
        sources.append(("under load", lambda r, q: loaded_rows(r, q, args.load)))
    rows: list[dict[str, Any]] = []
    for name, source in sources:
        print(f"== {name}\n{ROW_HEADER}", flush=True)
        for row in source(args.repeats, args.quick):
            print(format_row(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
