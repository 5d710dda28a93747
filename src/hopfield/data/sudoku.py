"""Sudoku puzzles: an offline generator with unique solutions, and loaders for the standard files.

Boards are 81-cell arrays in row-major order, 0 for a blank and 1-9 for a digit — the layout of
the Recurrent Relational Network "sudoku-hard" CSV files (Palm et al. 2018; rows
``puzzle,solution`` of 81 characters) that Hyper-SET trains on.

* :func:`generate_puzzles` makes ``n`` puzzles reproducibly from a seed: a random full grid
  (randomised backtracking), then cells are blanked in random order whenever the puzzle keeps a
  unique solution, down to a target number of givens. Pure Python; puzzle ``i`` depends only on
  ``(seed, i)``, so results can be cached and extended (:func:`cached_puzzles`). Random removal
  bottoms out around 22-28 givens, the easy end of Palm's 17-34 range.
* :func:`load_sudoku_csv` reads RRN-style CSV files; :func:`load_satnet` reads SATNet's one-hot
  ``features.pt`` / ``labels.pt``; :func:`load_sudoku_dataset` finds either below the data root
  via :func:`hopfield.data.files.locate`.
"""

from __future__ import annotations

import os
import random
import warnings
import zipfile
from pathlib import Path

import numpy as np

from hopfield.data.files import DataFile, locate

__all__ = [
    "RRN_FILES",
    "SATNET_FILES",
    "cached_puzzles",
    "count_solutions",
    "generate_puzzle",
    "generate_puzzles",
    "is_valid_solution",
    "load_satnet",
    "load_sudoku_csv",
    "load_sudoku_dataset",
    "solve",
]

RRN_URL = "https://www.dropbox.com/s/rp3hbjs91xiqdgc/sudoku-hard.zip?dl=1"
SATNET_URL = "https://powei.tw/sudoku.zip"
# User-supplied files: no checksum is pinned (sha256 ""), the URL says where to get them.
RRN_FILES = {
    split: DataFile(f"sudoku/sudoku-hard/{split}.csv", "", RRN_URL)
    for split in ("train", "valid", "test")
}
SATNET_FILES = {
    name: DataFile(f"sudoku/satnet/{name}.pt", "", SATNET_URL) for name in ("features", "labels")
}

_ALL = 0x3FE  # bits 1..9
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]


def _check_board(board: object, name: str = "board") -> list[int]:
    cells = [int(v) for v in np.asarray(board).reshape(-1)]
    if len(cells) != 81:
        raise ValueError(f"{name} must have 81 cells, got {len(cells)}")
    if any(v < 0 or v > 9 for v in cells):
        raise ValueError(f"{name} must hold values in 0..9")
    return cells


def _search(cells: list[int], limit: int, rng: random.Random | None, first: list[list[int]]) -> int:
    """Count solutions up to ``limit`` by backtracking with minimum-remaining-values ordering."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(cells):
        if v:
            bit = 1 << v
            if rows[_ROW[i]] & bit or cols[_COL[i]] & bit or boxes[_BOX[i]] & bit:
                return 0
            rows[_ROW[i]] |= bit
            cols[_COL[i]] |= bit
            boxes[_BOX[i]] |= bit
    empty = [i for i, v in enumerate(cells) if not v]
    count = 0

    def recurse(depth: int) -> bool:
        nonlocal count
        if depth == len(empty):
            count += 1
            if not first:
                first.append(list(cells))
            return count >= limit
        best, best_mask, best_n = -1, 0, 10
        for k in range(depth, len(empty)):
            i = empty[k]
            mask = _ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
            n = bin(mask).count("1")
            if n < best_n:
                best, best_mask, best_n = k, mask, n
                if n <= 1:
                    break
        if best_n == 0:
            return False
        empty[depth], empty[best] = empty[best], empty[depth]
        i = empty[depth]
        digits = [v for v in range(1, 10) if best_mask >> v & 1]
        if rng is not None:
            rng.shuffle(digits)
        r, c, b = _ROW[i], _COL[i], _BOX[i]
        for v in digits:
            bit = 1 << v
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            cells[i] = v
            stop = recurse(depth + 1)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
            cells[i] = 0
            if stop:
                empty[depth], empty[best] = empty[best], empty[depth]
                return True
        empty[depth], empty[best] = empty[best], empty[depth]
        return False

    recurse(0)
    return count


def count_solutions(board: object, limit: int = 2) -> int:
    """Number of solutions of ``board`` (81 cells, 0 = blank), counting at most ``limit``."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return _search(_check_board(board), limit, None, [])


def solve(board: object) -> np.ndarray | None:
    """A solution ``(81,)`` int8 of ``board``, or ``None`` when it has none."""
    first: list[list[int]] = []
    _search(_check_board(board), 1, None, first)
    return np.asarray(first[0], dtype=np.int8) if first else None


def is_valid_solution(solution: object, puzzle: object | None = None) -> bool:
    """Whether ``solution`` is a complete valid grid (agreeing with ``puzzle``'s givens)."""
    cells = _check_board(solution, "solution")
    grid = np.asarray(cells).reshape(9, 9)
    want = set(range(1, 10))
    units = [
        *grid,
        *grid.T,
        *(grid[r : r + 3, c : c + 3].ravel() for r in (0, 3, 6) for c in (0, 3, 6)),
    ]
    if any(set(unit.tolist()) != want for unit in units):
        return False
    if puzzle is not None:
        givens = np.asarray(_check_board(puzzle, "puzzle"))
        return bool(np.all((givens == 0) | (givens == np.asarray(cells))))
    return True


def generate_puzzle(
    seed: int, min_givens: int = 17, max_givens: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One puzzle with a unique solution: ``(puzzle, solution)``, each ``(81,)`` int8.

    Cells of a random full grid are visited in random order and blanked while the solution stays
    unique and more than ``min_givens`` remain; the number of givens ends in
    ``[min_givens, max_givens]`` when removal allows (it stops early, at a minimal puzzle,
    otherwise). A target drawn uniformly from ``[min_givens, max_givens]`` is used;
    ``max_givens=None`` means ``min_givens`` (blank as many cells as uniqueness allows).
    """
    max_givens = min_givens if max_givens is None else max_givens
    if not 17 <= min_givens <= max_givens <= 81:
        raise ValueError(
            f"need 17 <= min_givens <= max_givens <= 81, got {min_givens}, {max_givens}"
        )
    rng = random.Random(seed)
    first: list[list[int]] = []
    _search([0] * 81, 1, rng, first)
    solution = first[0]
    target = rng.randint(min_givens, max_givens)
    puzzle = list(solution)
    givens = 81
    order = list(range(81))
    rng.shuffle(order)
    for i in order:
        if givens <= target:
            break
        value, puzzle[i] = puzzle[i], 0
        if _search(list(puzzle), 2, None, []) == 1:
            givens -= 1
        else:
            puzzle[i] = value
    return np.asarray(puzzle, dtype=np.int8), np.asarray(solution, dtype=np.int8)


def generate_puzzles(
    n: int, seed: int = 0, min_givens: int = 17, max_givens: int | None = None, start: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Puzzles ``start .. start+n-1`` of the stream ``seed``: ``(puzzles, solutions)`` ``(n, 81)``."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    out = [generate_puzzle(seed * 1_000_003 + start + i, min_givens, max_givens) for i in range(n)]
    puzzles = np.stack([p for p, _ in out]) if out else np.zeros((0, 81), np.int8)
    solutions = np.stack([s for _, s in out]) if out else np.zeros((0, 81), np.int8)
    return puzzles, solutions


def cached_puzzles(
    n: int,
    seed: int,
    min_givens: int = 17,
    max_givens: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`generate_puzzles` with an ``.npz`` cache that grows as more puzzles are asked for.

    A cache file that cannot be read, or does not hold puzzles with valid solutions
    (:func:`_read_cache`), is rebuilt with a warning naming it (the puzzles are a function of
    the seed, so nothing is lost)."""
    if cache_dir is None:
        return generate_puzzles(n, seed, min_givens, max_givens)
    top = min_givens if max_givens is None else max_givens
    path = Path(cache_dir) / f"sudoku_seed{seed}_givens{min_givens}-{top}.npz"
    puzzles = np.zeros((0, 81), np.int8)
    solutions = np.zeros((0, 81), np.int8)
    if path.is_file():
        try:
            puzzles, solutions = _read_cache(
                path, generate_puzzles(1, seed, min_givens, max_givens)
            )
        except ValueError as error:
            warnings.warn(f"{error}; rebuilding it", stacklevel=2)
    if len(puzzles) < n:
        more_p, more_s = generate_puzzles(
            n - len(puzzles), seed, min_givens, max_givens, start=len(puzzles)
        )
        puzzles = np.concatenate([puzzles, more_p])
        solutions = np.concatenate([solutions, more_s])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, puzzles=puzzles, solutions=solutions)
        os.replace(tmp, path)
    return puzzles[:n], solutions[:n]


def _read_cache(path: Path, first: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The ``(puzzles, solutions)`` ``(k, 81)`` int8 of cache file ``path``; ``ValueError``
    naming it when it cannot be read, does not hold valid grids whose givens the puzzles keep,
    or does not start with ``first`` (puzzle 0 of its stream, ``(1, 81)`` each)."""
    try:
        with np.load(path) as data:
            puzzles, solutions = data["puzzles"], data["solutions"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"sudoku cache {path} cannot be read ({error})") from error
    if (
        puzzles.ndim != 2
        or puzzles.shape[1:] != (81,)
        or puzzles.shape != solutions.shape
        or not np.issubdtype(puzzles.dtype, np.integer)
        or not np.issubdtype(solutions.dtype, np.integer)
    ):
        raise ValueError(
            f"sudoku cache {path} holds puzzles {puzzles.shape} {puzzles.dtype} and solutions "
            f"{solutions.shape} {solutions.dtype}, expected two (k, 81) integer arrays"
        )
    grids = solutions.reshape(-1, 9, 9)
    boxes = grids.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9)
    digits = np.arange(1, 10)
    valid = all(
        (np.sort(units, axis=-1) == digits).all()
        for units in (grids, grids.transpose(0, 2, 1), boxes)
    )
    if not valid or not ((puzzles == 0) | (puzzles == solutions)).all():
        raise ValueError(f"sudoku cache {path} holds a solution that is no valid grid or puzzle")
    if len(puzzles) and not (
        np.array_equal(puzzles[:1], first[0]) and np.array_equal(solutions[:1], first[1])
    ):
        raise ValueError(f"sudoku cache {path} holds puzzles of another stream")
    return puzzles.astype(np.int8), solutions.astype(np.int8)


def _parse_board(text: str, name: str) -> list[int]:
    text = text.strip()
    if len(text) != 81:
        raise ValueError(f"{name}: a board needs 81 characters, got {len(text)}")
    return [0 if ch in ".0" else int(ch) for ch in text]


def load_sudoku_csv(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """RRN-style CSV (``puzzle,solution`` per line, 0 or ``.`` for blanks; a header is skipped)."""
    puzzles, solutions = [], []
    with Path(path).open() as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.split(",")
            if len(parts) != 2:
                raise ValueError(f"{path}:{number}: expected 'puzzle,solution'")
            if number == 1 and not parts[0].strip()[:1].isdigit() and parts[0].strip()[:1] != ".":
                continue  # header
            puzzles.append(_parse_board(parts[0], f"{path}:{number}"))
            solutions.append(_parse_board(parts[1], f"{path}:{number}"))
    return np.asarray(puzzles, np.int8).reshape(-1, 81), np.asarray(solutions, np.int8).reshape(
        -1, 81
    )


def load_satnet(
    features: str | os.PathLike[str], labels: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    """SATNet's one-hot tensors ``(n, 9, 9, 9)``: a cell with no hot digit is blank."""
    import torch

    def decode(path: str | os.PathLike[str]) -> np.ndarray:
        onehot = torch.load(path, map_location="cpu", weights_only=True)
        if onehot.dim() != 4 or tuple(onehot.shape[1:]) != (9, 9, 9):
            raise ValueError(f"{path}: expected a (n, 9, 9, 9) one-hot tensor")
        digits = onehot.argmax(-1) + 1
        digits[onehot.sum(-1) == 0] = 0
        return digits.reshape(-1, 81).numpy().astype(np.int8)

    return decode(features), decode(labels)


def load_sudoku_dataset(
    name: str, split: str = "train", data_dir: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A standard Sudoku set below the data root: ``"rrn-hard"`` (split train/valid/test) or
    ``"satnet"`` (one file; ``split`` is ignored). Raises
    :class:`~hopfield.data.files.DataNotFoundError` with the download URL when absent."""
    if name == "rrn-hard":
        if split not in RRN_FILES:
            raise ValueError(f"split must be one of {sorted(RRN_FILES)}, got {split!r}")
        return load_sudoku_csv(locate(RRN_FILES[split], data_dir))
    if name == "satnet":
        return load_satnet(
            locate(SATNET_FILES["features"], data_dir), locate(SATNET_FILES["labels"], data_dir)
        )
    raise ValueError(f"name must be 'rrn-hard' or 'satnet', got {name!r}")
