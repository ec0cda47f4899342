"""Each row of ``lessons/CHECKED.md`` points at the lines that make its statement.

A row's first cell names its lines, ``NN:first-last`` in lesson ``NN``, or ``path:first-last``
in backticks for another file of the repository (an assignment's text), each followed by a
phrase in double quotes that those lines contain. An edit that moves a statement away
from its row's lines fails here, with the row, the lines it names and where the phrase is now.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = REPO / "lessons" / "CHECKED.md"
LESSONS = {p.name[:2]: p for p in (REPO / "lessons").glob("[0-9][0-9]-*.py")}
# a lesson's lines, as a row's first cell names them: "11:385-388" or "05:67"
LINES = re.compile(r"(?<![\w/.])(\d\d):(\d+)(?:-(\d+))?(?![\d-])")
# the same, with the phrase those lines contain
ANCHORED = re.compile(LINES.pattern + r' "([^"]+)"')
# a file of the repository's lines, with the phrase: `exercises/source/...py:5-7` "..."
PATH_ANCHORED = re.compile(r'`([\w./-]+):(\d+)(?:-(\d+))?`( "([^"]+)")?')


def _text(lines: list[str]) -> str:
    """Lines as one string of words: comment marks dropped, so a phrase may wrap."""
    return " ".join(" ".join(re.sub(r"^\s*#\s?", "", line).split()) for line in lines)


def _rows() -> list[tuple[int, str]]:
    """(line number in CHECKED.md, first cell) of every row of the table."""
    rows = []
    for number, line in enumerate(CHECKED.read_text().splitlines(), 1):
        if line.startswith("| ") and not line.startswith(("| lesson ", "| --- ")):
            rows.append((number, line.split(" | ")[0].removeprefix("| ")))
    return rows


def _where(lines: list[str], phrase: str) -> list[int]:
    """The numbers of the lines at which ``phrase`` starts (it may wrap onto three more)."""
    def holds(start: int) -> bool:
        return phrase in _text(lines[start:start + 4])
    return [start + 1 for start in range(len(lines))
            if holds(start) and not (start + 1 < len(lines) and holds(start + 1))]


ROWS = _rows()


def test_the_table_has_rows():
    assert len(ROWS) > 100


@pytest.mark.parametrize(("row", "cell"), ROWS, ids=[f"row{n}" for n, _ in ROWS])
def test_every_range_names_a_phrase_its_lines_contain(row: int, cell: str):
    bare = [m.group(0) for m in LINES.finditer(cell)
            if m.group(1) in LESSONS and not cell[m.end():].startswith(' "')]
    assert not bare, (f"lessons/CHECKED.md line {row}: {', '.join(bare)} names lesson lines "
                      "without a phrase they contain; add one after it in double quotes, "
                      'e.g. 05:67 "1 MiB per core"')
    cited = [(LESSONS[m.group(1)], m.group(2), m.group(3), m.group(4))
             for m in ANCHORED.finditer(cell)]
    for m in PATH_ANCHORED.finditer(cell):
        path = REPO / m.group(1)
        assert path.is_file(), f"lessons/CHECKED.md line {row}: no file {m.group(1)}"
        assert m.group(5), (f"lessons/CHECKED.md line {row}: {m.group(0)} names lines without a "
                            'phrase they contain; add one after it in double quotes')
        cited.append((path, m.group(2), m.group(3), m.group(5)))
    for path, first, last, phrase in cited:
        first, last = int(first), int(last or first)
        lines = path.read_text().splitlines()
        if phrase in _text(lines[first - 1:last]):
            continue
        now = _where(lines, phrase)
        where = (f"it is now at line {', '.join(map(str, now))}" if now else
                 "the file no longer contains it")
        name = path.relative_to(REPO)
        pytest.fail(f"lessons/CHECKED.md line {row} ({name}:{first}-{last}): "
                    f"{phrase!r} is not in lines {first}-{last} of {name}; "
                    f"{where}. Move the row's lines to where the statement stands now and "
                    "check the statement against the source again (or, if the file no "
                    "longer makes it, change or remove the row).", pytrace=False)
