"""Progress bars are pure text: full at total, empty at zero, never overflowing."""

from __future__ import annotations

import io

from retrytopics.progress import ProgressBoard, Stage, render_bar


def test_bar_fill_is_proportional_and_bounded() -> None:
    assert "[" + "." * 30 + "]" in render_bar(Stage("main", 0, 100))
    assert "[" + "#" * 15 + "." * 15 + "]" in render_bar(Stage("main", 50, 100))
    assert "[" + "#" * 30 + "]" in render_bar(Stage("dlq", 130, 100, "more than expected"))
    assert render_bar(Stage("tier 1s", 3, 0)).split()[-1] == "3/0"


def test_board_prints_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    board = ProgressBoard(out, interval_s=0)
    board.update([Stage("main", 1, 2), Stage("dlq", 0, 2)], force=True)
    assert out.getvalue() == "main 1/2 | dlq 0/2\n"
