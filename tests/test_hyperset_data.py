"""Sudoku generator, solver and file loaders."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from hopfield.data import DataNotFoundError
from hopfield.data.sudoku import (
    cached_puzzles,
    count_solutions,
    generate_puzzle,
    generate_puzzles,
    is_valid_solution,
    load_satnet,
    load_sudoku_csv,
    load_sudoku_dataset,
    solve,
)

# A well-known puzzle with a unique solution (Wikipedia's example).
PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def _board(text: str) -> np.ndarray:
    return np.array([int(c) for c in text], dtype=np.int8)


def test_solver_and_counter() -> None:
    puzzle, solution = _board(PUZZLE), _board(SOLUTION)
    assert count_solutions(puzzle) == 1
    assert np.array_equal(solve(puzzle), solution)
    assert is_valid_solution(solution, puzzle)
    broken = solution.copy()
    broken[[0, 1]] = broken[[1, 0]]
    assert not is_valid_solution(broken)
    assert count_solutions(np.zeros(81), limit=5) == 5
    clash = puzzle.copy()
    clash[1] = 5  # two 5s in the first row
    assert count_solutions(clash) == 0 and solve(clash) is None
    with pytest.raises(ValueError, match="81 cells"):
        count_solutions(np.zeros(80))


def test_generated_puzzles_have_unique_solutions_and_are_reproducible() -> None:
    puzzles, solutions = generate_puzzles(4, seed=3, min_givens=30, max_givens=36)
    again, _ = generate_puzzles(4, seed=3, min_givens=30, max_givens=36)
    assert np.array_equal(puzzles, again)
    for p, s in zip(puzzles, solutions, strict=True):
        assert is_valid_solution(s, p)
        assert count_solutions(p) == 1
        assert 30 <= int((p > 0).sum()) <= 36
    # "as few givens as uniqueness allows": a minimal puzzle loses uniqueness on any removal
    hard, _ = generate_puzzle(11)
    givens = np.flatnonzero(hard)
    assert len(givens) < 32
    for i in givens[:5]:
        fewer = hard.copy()
        fewer[i] = 0
        assert count_solutions(fewer) == 2
    with pytest.raises(ValueError, match="min_givens"):
        generate_puzzle(0, min_givens=10)


def test_cache_grows_and_matches_stream(tmp_path: Path) -> None:
    first = cached_puzzles(2, 5, 34, 40, tmp_path)
    more = cached_puzzles(3, 5, 34, 40, tmp_path)
    direct = generate_puzzles(3, 5, 34, 40)
    assert np.array_equal(more[0][:2], first[0]) and np.array_equal(more[0], direct[0])
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_csv_and_satnet_loaders(tmp_path: Path) -> None:
    csv = tmp_path / "sudoku" / "sudoku-hard" / "test.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text(
        f"quizzes,solutions\n{PUZZLE},{SOLUTION}\n{PUZZLE.replace('0', '.')},{SOLUTION}\n"
    )
    puzzles, solutions = load_sudoku_csv(csv)
    assert puzzles.shape == (2, 81) and np.array_equal(puzzles[0], puzzles[1])
    assert np.array_equal(solutions[0], _board(SOLUTION))
    p2, _ = load_sudoku_dataset("rrn-hard", "test", tmp_path)
    assert np.array_equal(p2, puzzles)
    onehot = torch.zeros(1, 9, 9, 9)
    board = torch.as_tensor(_board(PUZZLE), dtype=torch.long).reshape(9, 9)
    rows, cols = torch.nonzero(board, as_tuple=True)
    onehot[0, rows, cols, board[rows, cols] - 1] = 1
    torch.save(onehot, tmp_path / "features.pt")
    torch.save(onehot, tmp_path / "labels.pt")
    features, _ = load_satnet(tmp_path / "features.pt", tmp_path / "labels.pt")
    assert np.array_equal(features[0], _board(PUZZLE))
    with pytest.raises(DataNotFoundError, match="dropbox"):
        load_sudoku_dataset("rrn-hard", "train", tmp_path)
    with pytest.raises(ValueError, match="name"):
        load_sudoku_dataset("kaggle")


def test_a_damaged_or_foreign_cache_is_rebuilt_with_a_warning(tmp_path: Path) -> None:
    """A truncated cache raised BadZipFile on every call and one of the wrong shape gave wrong
    boards; every damaged cache is now rebuilt once, with a warning naming it."""
    puzzles, solutions = generate_puzzles(3, 5, 34, 40)
    cached_puzzles(3, 5, 34, 40, tmp_path)
    (path,) = tmp_path.glob("*.npz")
    truncated = path.read_bytes()[: path.stat().st_size // 2]
    broken = solutions.copy()
    broken[0, 0] = broken[0, 1]
    other = generate_puzzles(3, 6, 34, 40)

    def truncate() -> None:
        path.write_bytes(truncated)

    def save(p: np.ndarray, s: np.ndarray) -> Callable[[], None]:
        return lambda: np.savez_compressed(path, puzzles=p, solutions=s)

    damages = [
        ("cannot be read", truncate),
        (r"expected two \(k, 81\)", save(puzzles[:, :80], solutions[:, :80])),
        ("no valid grid", save(np.zeros_like(broken), broken)),
        ("another stream", save(*other)),
    ]
    for reason, damage in damages:
        damage()
        with pytest.warns(UserWarning, match=f"sudoku cache {re.escape(str(path))}.*{reason}"):
            got = cached_puzzles(3, 5, 34, 40, tmp_path)
        assert np.array_equal(got[0], puzzles) and np.array_equal(got[1], solutions)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # rebuilt: the next call reads it without a warning
            assert np.array_equal(cached_puzzles(3, 5, 34, 40, tmp_path)[0], puzzles)
