"""`kernelsim html FILE.py:FUNC -o out.html`."""

from pathlib import Path

import kernelsim
from kernelsim import cli

EXAMPLES = Path(kernelsim.__file__).resolve().parent / "examples.py"


def test_html_subcommand_writes_the_viewer(tmp_path, capsys):
    out = tmp_path / "mm.html"
    assert cli.main(["html", f"{EXAMPLES}:matmul_target", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and 'class="ks-viewer-host"' in text
    assert "wrote" in capsys.readouterr().out
    frag = tmp_path / "frag.html"
    assert cli.main(["html", f"{EXAMPLES}:matmul_target", "-o", str(frag), "--fragment"]) == 0
    assert frag.read_text().startswith("<div")
    assert cli.main(["html", f"{EXAMPLES}:matmul_target", "-o", str(frag), "--call", "5"]) == 2
