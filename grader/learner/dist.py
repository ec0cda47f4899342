"""``pallas-course dist --to DIR|FILE.zip``: what a student gets, and nothing an instructor keeps.

In: the lessons, the released student notebooks with their visible reference cases (the same
layout as a workspace: ``lessons/``, ``exercises/<assignment>/``), kernelsim, the learner-side
check (``grader/``: ``course``, the ``pallas-course check`` command and the modules they import,
the tasks with their hidden cases removed), JupyterLab's settings for opening ``.py`` lessons as
notebooks, a ``pyproject.toml`` with the learner's dependencies only (no nbgrader, hub, Dask or
PostgreSQL), an ``install.sh`` that finds a Python 3.11-3.13 (keeping a JAX that
Python already has), and a README.

Out: the source notebooks (solutions, hidden tests), hidden reference cases, the gradebook,
nbgrader's configuration and the grading machinery. ``tests/workspace/test_dist.py`` searches a
built distribution for all of these.
"""

from __future__ import annotations

import ast
import shutil
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from grader import rooms
from grader.learner import workspace
from grader.logistics import releases
from grader.verdict import refs

# the student copy's size once installed: measured by tests/workspace/test_dist.py
# (test_student_copy_installs_as_its_readme_says, `du -sm .venv`: 939 in a clean clone at
# c794f29; a learner's walk-through at 00b14e4 measured 978), Python 3.12 on Linux x86-64;
# README.md says the same
INSTALLED_MB = 950
# the oldest Python a student copy installs on: Debian 12's python3, and what Colab's and Kaggle's
# TPU runtimes may have; kernelsim's oldest JAX (adapter.SUPPORTED_JAX[0]) is the last for it
LEARNER_PYTHON = "3.11"

README = """# pallas-course (student copy)

Lessons and exercises on writing JAX Pallas kernels, for Python 3.11, 3.12 or 3.13.

```sh
sh install.sh                  # makes .venv with the learner's packages (about MB_INSTALLED MB)
. .venv/bin/activate           # the `pallas-course` command, here and in JupyterLab's terminal
JUPYTER_CONFIG_PATH=jupyter jupyter lab
```

`install.sh` takes the first of python3.13, python3.12, python3 and python3.11 (or `PYTHON=...`)
and installs the course's JAX: jax JAX_NEW on Python 3.12 and 3.13, jax JAX_OLD (the last release
for 3.11) on Python 3.11. Debian 12's `python3` is 3.11 and will do, without `sudo`: where
Debian's `python3-venv` is missing, `install.sh` takes pip from the package index.

**A Python that already has JAX keeps it.** When that Python imports `jax` (a Colab or Kaggle TPU
runtime, a Cloud TPU VM: JAX with its TPU library), `install.sh` makes `.venv` see that Python's
packages (after its own) and installs only what the course adds, so your kernels compile on
that machine's chip with its own JAX. `KEEP_JAX=0 sh install.sh` installs the course's JAX
instead; `KEEP_JAX=1` stops if there is none to keep. In a Colab or Kaggle notebook (no
terminal), with this folder uploaded and unzipped beside it, install it from a cell without the
JAX pin, then run each lesson or exercise from its own folder:

```
!pip install -q ./pallas-course     # keeps the runtime's JAX ("./pallas-course[jax]" would not)
%cd pallas-course/exercises/01_first_kernel
```

A lesson's check says whether each kernel ran compiled on the chip. The course is checked on jax
JAX_OLD and JAX_NEW; a lesson cell that needs a newer JAX than the runtime's says which release.

- `lessons/`: the lessons (the `.py` files open as notebooks in JupyterLab)
- `exercises/<assignment>/`: the exercise notebooks. Each task has a checking cell that runs
  your kernel on the visible cases in `refs/`; *Kernel > Restart Kernel and Run All Cells*
  checks every task and the notebook's last cell lists what passed and failed. In a terminal:
  `pallas-course check first_kernel.ipynb` (from this folder or the exercise's). More cases
  (other shapes, bfloat16) run when your submission is graded.
- `kernelsim/`: the tool the checks use to show which blocks your kernel moves, step by step.

Hand in the `.ipynb` notebooks the way your course tells you to.
"""

# Makes .venv with Python 3.11-3.13 and installs the copy: with the course's JAX (the `jax`
# extra), or on top of a Python that has a JAX of its own, keeping it. Without Debian's
# python3-venv (no ensurepip) it makes the venv without pip and takes pip from the package index.
INSTALL_SH = r"""#!/bin/sh
# Make .venv with Python 3.11, 3.12 or 3.13 and install this course copy into it (PYTHON=...
# names one). A Python that already imports jax keeps its JAX (KEEP_JAX=0: install the course's).
# No sudo: without Debian's python3-venv, pip comes from the package index.
set -e
cd "$(dirname "$0")"
PY=""
for p in ${PYTHON:-} python3.13 python3.12 python3 python3.11; do
  if command -v "$p" >/dev/null 2>&1 &&
     "$p" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 14))' 2>/dev/null
  then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  cat >&2 <<'END'
No Python 3.11, 3.12 or 3.13 found.
- Debian 12 and Ubuntu 22.04 or later have one as python3 (sudo apt-get install -y python3)
- macOS (Apple's python3 is 3.9): brew install python@3.12
- anywhere: name one with PYTHON=/path/to/python3.12 sh install.sh
END
  exit 1
fi
KEEP=${KEEP_JAX:-}
if [ -z "$KEEP" ]; then
  if "$PY" -c 'import jax' >/dev/null 2>&1; then KEEP=1; else KEEP=0; fi
fi
if [ "$KEEP" = 1 ] && ! JAX=$("$PY" -c 'import jax; print(jax.__version__)'); then
  echo "KEEP_JAX=1, but $PY cannot import jax: run without KEEP_JAX to install the course's" >&2
  exit 1
fi
if ! "$PY" -m venv .venv >/dev/null 2>&1; then
  # Debian without python3-venv (no ensurepip): a venv without pip, and pip comes below
  rm -rf .venv
  "$PY" -m venv --without-pip .venv
fi
WHAT=".[jax]"
if [ "$KEEP" = 1 ]; then
  echo "keeping $PY's jax $JAX: .venv sees that Python's packages (KEEP_JAX=0: the course's JAX)"
  WHAT=.
  # its import path, after .venv's own (a .pth file): what .venv installs comes first
  "$PY" - .venv/bin/python <<'END'
import os, subprocess, sys
ask = "import sys, sysconfig; print(sysconfig.get_path('purelib')); print(*sys.path, sep=chr(10))"
site, *own = subprocess.run([sys.argv[1], "-c", ask], capture_output=True, text=True,
                            check=True).stdout.splitlines()
kept = [p for p in sys.path if p and os.path.isdir(p) and p not in own]
with open(os.path.join(site, "kept-python.pth"), "w") as f:
    f.write("".join(p + "\n" for p in kept))
END
fi
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  .venv/bin/python - <<'END'
import hashlib, json, os, re, subprocess, sys, tempfile, urllib.request
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
ask = urllib.request.Request(index + "/pip/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(ask))["files"]
wheels = {tuple(map(int, m[1].split("."))): f for f in files
          if (m := re.fullmatch(r"pip-([\d.]+)-py3-none-any\.whl", f["filename"]))
          and not f.get("yanked")}
newest = wheels[max(wheels)]
data = urllib.request.urlopen(newest["url"]).read()
if hashlib.sha256(data).hexdigest() != newest["hashes"]["sha256"]:
    sys.exit(f"install.sh: {newest['filename']} from {index} does not match its sha256")
with tempfile.TemporaryDirectory() as d:
    wheel = os.path.join(d, newest["filename"])
    with open(wheel, "wb") as f:
        f.write(data)
    subprocess.run([sys.executable, wheel + "/pip", "install", "-q", wheel], check=True)
END
fi
echo "installing the course's packages into .venv with $("$PY" --version)..."
.venv/bin/python -m pip install -q --disable-pip-version-check -e "$WHAT"
.venv/bin/python -c 'import jax; print(f"jax {jax.__version__} from {jax.__file__}")'
echo "done: . .venv/bin/activate, then JUPYTER_CONFIG_PATH=jupyter jupyter lab"
"""

# The copy's JupyterLab settings (``jupyter/`` on JUPYTER_CONFIG_PATH): a terminal that is not a
# login shell. Started without a TTY, jupyter_server_terminals makes the terminal a login shell
# (``-l``), whose /etc/profile sets PATH anew: the activated .venv's `pallas-course` was gone.
SERVER_CONFIG = """\"\"\"pallas-course's student copy: JupyterLab's terminals are a plain shell,
never a login shell, which would set PATH anew and lose the activated .venv.\"\"\"

import os
import shutil

c = get_config()  # noqa: F821 - traitlets provides it to config files
c.ServerApp.terminado_settings = {
    "shell_command": [os.environ.get("SHELL") or shutil.which("bash") or "/bin/sh"]}
"""


def strip_hidden_cases(source: str) -> tuple[str, int]:
    """A task module's source without its hidden cases, and how many were removed: every
    ``make_case(...)`` call whose fifth argument (or ``hidden=``) is True is cut out of the tuple
    or list that holds it. The rest of the text is kept as written (not re-printed by
    ``ast.unparse``, whose f-strings from Python 3.12 do not parse on 3.11, where the copy runs
    too), and the result is checked to be the module with those calls removed."""

    def hidden(node: ast.AST) -> bool:
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_case"):
            return False
        flag = node.args[4] if len(node.args) > 4 else next(
            (k.value for k in node.keywords if k.arg == "hidden"), None)
        return isinstance(flag, ast.Constant) and flag.value is True

    tree = ast.parse(source)
    text = source.encode()  # the tree's column offsets count UTF-8 bytes
    line_starts = [0]
    for line in text.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(line: int, col: int) -> int:
        return line_starts[line - 1] + col

    cuts: list[tuple[int, int, bytes]] = []  # (start, end, replacement) in ``text``
    for node in ast.walk(tree):
        if not isinstance(node, ast.Tuple | ast.List):
            continue
        for e in (e for e in node.elts if hidden(e)):
            start, end = offset(e.lineno, e.col_offset), offset(e.end_lineno, e.end_col_offset)
            end += len(text[end:]) - len(text[end:].lstrip(b" \t"))  # the separating comma
            end += text[end:end + 1] == b","
            end += len(text[end:]) - len(text[end:].lstrip(b" \t"))
            line_start = line_starts[e.lineno - 1]
            if not text[line_start:start].strip() and text[end:end + 1] in (b"\n", b""):
                start, end = line_start, end + 1  # a case on lines of its own: drop the lines
            cuts.append((start, end, b""))
        node.elts = [e for e in node.elts if not hidden(e)]
    removed = len(cuts)
    if removed == 0:
        return source, 0
    doc = tree.body[0]
    if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
        note = " Visible cases only (written by pallas-course dist)."
        doc.value.value += note
        end = offset(doc.end_lineno, doc.end_col_offset)
        quote = 3 if text[end - 3:end] in (b'"""', b"'''") else 1
        cuts.append((end - quote, end - quote, note.encode()))
    for start, end, replacement in sorted(cuts, reverse=True):
        text = text[:start] + replacement + text[end:]
    stripped = text.decode()
    if ast.dump(ast.parse(stripped)) != ast.dump(tree):
        raise ValueError("grader/learner/dist.py could not cut the hidden make_case(...) cases "
                         "out of a task module's text; write each case of a task's cases tuple "
                         "on lines of its own, followed by a comma")
    return stripped, removed


# what a learner runs of grader/: the notebooks' checks and the `pallas-course check` command
LEARNER_ENTRY_POINTS = ("learner.course", "learner.selfcheck", "learner.check")
def course_jax(repo: Path) -> dict[str, str]:
    """The copy's JAX release for each Python: the course's pin (pyproject.toml) from the
    course's oldest Python on, kernelsim's oldest supported release before it, keyed by the
    environment marker that picks it."""
    from kernelsim import adapter  # starts JAX: only the copy's pyproject needs it

    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    pinned = next(d.partition("==")[2] for d in project["dependencies"]
                  if d.startswith("jax[cpu]=="))
    course_python = project["requires-python"].split(",")[0].removeprefix(">=")
    return {f"python_version >= '{course_python}'": pinned,
            f"python_version < '{course_python}'": adapter.SUPPORTED_JAX[0]}


def jax_companions(repo: Path) -> list[str]:
    """What is installed beside a JAX the copy installs (pyproject.toml's
    ``tool.pallas-course.jax-companions``, with the reason)."""
    return tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["pallas-course"][
        "jax-companions"]


def student_pyproject(repo: Path) -> str:
    """The copy's pyproject: the base (but JAX) and ``learner`` dependencies, JAX and its
    companions as the extra ``jax`` (what ``install.sh`` leaves out on a Python that has a JAX of
    its own), and
    ``pallas-course`` as the learner's command (``grader.learner.check``: only ``check``)."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    deps = [*(d for d in project["dependencies"] if not d.startswith("jax")),
            *project["optional-dependencies"]["learner"]]
    newest = project["requires-python"].split(",")[1]
    lines = ["[build-system]", 'requires = ["setuptools>=68", "wheel"]',
             'build-backend = "setuptools.build_meta"', "", "[project]",
             'name = "pallas-course-student"', f'version = "{project["version"]}"',
             f'requires-python = ">={LEARNER_PYTHON},{newest}"', "dependencies = ["]
    lines += [f'    "{d}",' for d in deps]
    lines += ["]", "", "[project.optional-dependencies]", "jax = ["]
    lines += [f'    "jax[cpu]=={v}; {marker}",' for marker, v in course_jax(repo).items()]
    lines += [f'    "{d}",' for d in jax_companions(repo)]
    lines += ["]", "", "[project.scripts]", 'pallas-course = "grader.learner.check:main"',
              'kernelsim = "kernelsim.cli:main"', "",
              "[tool.setuptools.packages.find]", 'include = ["kernelsim*", "grader*"]', "",
              # a Colab cell's `pip install ./pallas-course` builds a wheel: it keeps only .py
              # files without this
              "[tool.setuptools.package-data]", 'kernelsim = ["views/viewer.js"]',
              'grader = ["tasks/shipped_kernels.json"]', ""]
    return "\n".join(lines)


def readme(repo: Path) -> str:
    """The copy's README, with its installed size and the JAX releases it installs."""
    old, new = sorted(course_jax(repo).values(), key=lambda v: tuple(map(int, v.split("."))))
    return (README.replace("MB_INSTALLED", str(INSTALLED_MB))
            .replace("JAX_OLD", old).replace("JAX_NEW", new))


def _copytree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", ".ipynb_checkpoints"))


def write_grader(source: Path, dest: Path, names: list[str] | None = None) -> None:
    """``source`` (a grader/ folder) copied to ``dest`` (which must not exist) with the hidden
    cases cut out of its task modules (``strip_hidden_cases``): the modules ``names``
    (``rooms.imported_modules``'s names) and the data they read, or, with None, every module
    and data file (a class's learners' grader/, deploy/setup-class.sh). Raises ValueError when
    no hidden case was found to cut: the copy would otherwise be taken for a stripped one."""
    if names is None:
        files = [p for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    else:
        files = [f for name in ["__init__", *names] for f in
                 (*rooms.module_files(source, name), *rooms.data_files(source, name))]
    hidden_removed = 0
    for src in files:
        target = dest / src.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".py":
            text, removed = strip_hidden_cases(src.read_text())
            hidden_removed += removed
            target.write_text(text)
        else:
            shutil.copyfile(src, target)
    if hidden_removed == 0:
        raise ValueError("grader/tasks/: no hidden make_case(...) cases found to remove; has the "
                         "case syntax changed? (grader/learner/dist.py strips them)")


def write_tree(root: Path, repo: Path, dest: Path) -> None:
    """The distribution as a folder ``dest`` (which must not exist)."""
    package = refs.REPO  # where this grader/ and kernelsim/ come from
    dest.mkdir(parents=True)
    for rel, src in workspace.course_files(root, repo).items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    _copytree(package / "kernelsim", dest / "kernelsim")
    write_grader(package / "grader", dest / "grader",
                 rooms.imported_modules(package / "grader", LEARNER_ENTRY_POINTS))
    (dest / "jupyter" / "labconfig").mkdir(parents=True)
    shutil.copyfile(package / "site" / "jupyter" / "labconfig" /
                    "default_setting_overrides.json",
                    dest / "jupyter" / "labconfig" / "default_setting_overrides.json")
    (dest / "jupyter" / "jupyter_server_config.py").write_text(SERVER_CONFIG)
    (dest / "pyproject.toml").write_text(student_pyproject(repo))
    (dest / "README.md").write_text(readme(repo))
    (dest / "install.sh").write_text(INSTALL_SH)
    (dest / "install.sh").chmod(0o755)


def build(root: Path, repo: Path, to: Path, log=print) -> Path:
    """Release what is stale, then write the distribution to ``to`` (a new folder, or a
    ``.zip`` file holding one folder ``pallas-course/``)."""
    stale = releases.stale_releases(root)
    if stale:
        from grader.logistics import batch  # seconds to import: only when something is stale

        batch.release(root, stale[0] if len(stale) == 1 else None, log=log)
    if to.exists():
        raise FileExistsError(f"{to} already exists: dist never overwrites; remove it or "
                              "choose another --to")
    to.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=to.parent, prefix=".dist-") as d:
        tree = Path(d) / "pallas-course"  # nothing appears at ``to`` unless all of it was written
        write_tree(root, repo, tree)
        if to.suffix != ".zip":
            tree.rename(to)
        else:
            with zipfile.ZipFile(Path(d) / "dist.zip", "w", zipfile.ZIP_DEFLATED) as zf:
                for f in sorted(tree.rglob("*")):
                    if f.is_file():
                        zf.write(f, f.relative_to(tree.parent).as_posix())
            (Path(d) / "dist.zip").replace(to)
    n = sum(1 for r in workspace.course_files(root, repo) if r.endswith(".ipynb"))
    log(f"student distribution -> {to} ({n} exercise notebook(s), lessons, kernelsim; no "
        "solutions, hidden cases or gradebook)")
    return to


if __name__ == "__main__":  # deploy/setup-class.sh: the class's learners' grader/
    if len(sys.argv) != 3:
        sys.exit("usage: python -m grader.learner.dist SOURCE_GRADER DEST: a copy of the "
                 "grader/ folder SOURCE_GRADER without hidden cases, at DEST")
    write_grader(Path(sys.argv[1]), Path(sys.argv[2]))
