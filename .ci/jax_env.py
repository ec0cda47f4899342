"""Make (or reuse) a venv with one JAX release and what kernelsim's suite needs.

usage: python .ci/jax_env.py VENV JAX_VERSION

The venv's Python is the one running this script. It gets ``jax[cpu]==JAX_VERSION`` with what
a student copy installs beside it (pyproject.toml's ``tool.pallas-course.jax-companions``), the
``kernelsim-test`` extra of pyproject.toml and what the learner's ``pallas-course check`` needs
of the ``learner`` extra (tests/learner: a student copy installs on such a Python and JAX);
kernelsim and grader are imported from the checkout (the course's own pins need a newer Python
than old JAX releases support). A stamp records what was
installed, so a second run with the same list installs nothing.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# of the learner extra, what tests/learner needs: a notebook run in a kernel (and the jsonschema
# that nbclient's nbformat imports in seconds, not the newest), and absl, which jax 0.10.2's
# Mosaic GPU module imports (grader.tasks imports that module)
LEARNER_CHECK = ("nbclient", "jsonschema", "absl-py")


def requirements(jax_version: str) -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    learner = [d for d in extras["learner"] if d.split("=")[0].split(">")[0] in LEARNER_CHECK]
    # what a student copy installs beside such a JAX (pyproject.toml says why)
    companions = pyproject["tool"]["pallas-course"]["jax-companions"]
    return [f"jax[cpu]=={jax_version}", *companions, *extras["kernelsim-test"], *learner,
            "ipykernel>=6,<8"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    env, jax_version = Path(argv[0]), argv[1]
    wanted = "\n".join([sys.version.split()[0], *requirements(jax_version)]) + "\n"
    stamp = env / ".installed-stamp"
    if stamp.exists() and stamp.read_text() == wanted:
        return 0
    python = env / "bin" / "python"
    if not python.exists():
        venv.create(env, with_pip=True, clear=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    result = subprocess.run([*pip, *requirements(jax_version)])
    if result.returncode:
        print(f"jax_env: could not install jax[cpu]=={jax_version} with Python "
              f"{sys.version.split()[0]} into {env}; check that this release exists for this "
              "Python (`pip index versions jax`) or pass another interpreter.", file=sys.stderr)
        return result.returncode
    stamp.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
