#!/bin/sh
# A learner's TPU runtime (Colab, Kaggle, the course's TPU machine: Python 3.11, jax 0.10.2 and
# libtpu preinstalled, no network): install the student copy there without touching its JAX and
# run a lesson's kernels from the installed copy, compiled on the chip.
#
#   build  (here, in a checkout with .venv, or PYTHON=...): `pallas-course dist` of this checkout
#          into dist/student-tpu/
#          (git-ignored, ~12 MB: the copy's folder and its wheel, for the device machine)
#   run [OUT] (there): the copy's wheel into a fresh folder with --no-deps (so the machine's jax
#          and numpy stay the only ones), then lesson 02 from the copy's folder, whose grader/ and
#          kernelsim/ are removed so that the installed ones answer, by bench/on_device.py
#          (cells in-process: no Jupyter kernel, no socket). Prints jax's version and where it
#          comes from, the backend, and per kernel: compiled / fell back / interpreted. Exit 0
#          when the lesson passed and, on an accelerator, every kernel compiled.
#          What the lesson imports beside JAX (matplotlib) comes from the machine's index:
#          COMMIT=<sha> sh bench/tpu_packages.sh sh bench/student_copy_on_device.sh run "$OUT"
# Try it on a CPU: JAX_PLATFORMS=cpu with a Python 3.11 venv that has jax 0.10.2 first on PATH.
set -eu
cd "$(dirname "$0")/.."
built=dist/student-tpu
case "${1:-}" in
build)
  python=${PYTHON:-$PWD/.venv/bin/python}
  rm -rf "$built"
  (cd exercises && PYTHONPATH=.. "$python" -m grader.cli dist --to "../$built/pallas-course")
  "$python" -m pip wheel -q --no-deps -w "$built" "$built/pallas-course"
  du -sh "$built"
  ;;
run)
  out=${2:-${OUT:-/tmp}}/student-copy
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  site="$work/site"
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-deps --no-index \
      --no-compile --target "$site" "$built"/pallas_course_student-*.whl
  cp -r "$built/pallas-course" "$work/copy"
  rm -rf "$work/copy/grader" "$work/copy/kernelsim"
  mkdir "$work/copy/bench"
  cp bench/on_device.py "$work/copy/bench/"
  # COMMIT=...: the device machine's copy of the tree may carry stale git metadata
  commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  cd "$work"
  python3 - "$site" <<'END'
import sys

import jax

import grader.learner.course
import kernelsim

site = sys.argv[1]
for module in (kernelsim, grader.learner.course):
    assert module.__file__.startswith(site), f"{module.__name__} from {module.__file__}"
kept = sorted(p.name for p in __import__("pathlib").Path(site).iterdir()
              if p.name.split("-")[0] in ("jax", "jaxlib", "numpy", "libtpu"))
assert not kept, f"the copy's install brought {kept}: the machine's would be shadowed"
print(f"student copy installed in {site}; jax {jax.__version__} from {jax.__file__}")
END
  status=0
  python3 copy/bench/on_device.py --only lessons --out "$out" --commit "$commit" 02 || status=$?
  python3 - "$out/on_device.json" <<'END' || status=$?
import json
import sys

record = json.load(open(sys.argv[1]))
kernels = [k for run in record["notebooks"] for k in run["kernels"]]
compiled = sum(k["ran"] == "compiled" for k in kernels)
print(f"student copy on {record['chip']} ({record['backend']}), jax {record['jax']}: lesson 02 "
      f"{'passed' if all(r['passed'] for r in record['notebooks']) else 'FAILED'}, "
      f"{compiled} of {len(kernels)} kernels compiled")
for k in kernels:
    print(f"  {k['kernel']}: {k['ran']}")
accelerator = record["backend"] != "cpu"
sys.exit(accelerator and compiled < len(kernels))
END
  exit "$status"
  ;;
*)
  echo "usage: sh bench/student_copy_on_device.sh build | run [OUT]" >&2
  exit 2
  ;;
esac
