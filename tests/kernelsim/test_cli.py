"""The `kernelsim` command line, run as a user would (a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "kernelsim" / "examples.py"


def _kernelsim(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "kernelsim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_trace_prints_a_summary_with_first_and_last_steps():
    r = _kernelsim("trace", f"{EXAMPLES}:matmul_target", "--steps", "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "'matmul_kernel'  grid (8, 8, 8) = 512 steps" in out
    assert "33,554,432" in out  # x read N/bn = 8 times: 1024*1024*4*8
    assert "0     (0, 0, 0)   x_ref" in out
    assert "511   (7, 7, 7)   o_ref    (7, 7)  writeback" in out


def test_trace_measure_runs_the_target_and_says_no_accelerator_is_present():
    r = _kernelsim("trace", f"{EXAMPLES}:add_target", "--measure", "--steps", "0")
    assert r.returncode == 0, r.stderr
    assert "not measured: no accelerator is present (JAX's backend is cpu)" in r.stdout


def test_trace_json_is_to_dict(tmp_path):
    r = _kernelsim("trace", f"{EXAMPLES}:add_target", "--json", "--model", "gpu")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["model"], d["chip"]) == ("gpu", "h100")
    assert d["calls"][0]["hbm_read_bytes"] == 2 * 1024 * 1024 * 4


@pytest.mark.parametrize("source,message", [
    ("def target():\n    return (lambda x: x + 1), (1.0,)\n", "reached no pallas_call"),
    ("def other():\n    pass\n", "has no function 'target'"),
    ("def target():\n    return 3\n", "must return (fn, args)"),
    ("def target():\n    raise KeyError('weights')\n",
     "running {path}:target raised KeyError: 'weights'"),
])
def test_bad_targets_exit_2_with_a_message(tmp_path, source, message):
    path = tmp_path / "mine.py"
    path.write_text(source)
    r = _kernelsim("trace", f"{path}:target")
    assert r.returncode == 2
    assert message.format(path=path) in r.stderr
    assert "Traceback" not in r.stderr


def test_target_with_postponed_annotations_and_a_dataclass_loads(tmp_path):
    path = tmp_path / "configured.py"
    path.write_text(
        "from __future__ import annotations\n"
        "import dataclasses, functools\n"
        "import jax.numpy as jnp\n"
        "from kernelsim import examples as ex\n\n"
        "@dataclasses.dataclass\n"
        "class Config:\n"
        "    block: tuple[int, int] = (128, 128)\n\n"
        "def target():\n"
        "    x = jnp.zeros((256, 256), jnp.float32)\n"
        "    return functools.partial(ex.add, block=Config().block), (x, x)\n")
    r = _kernelsim("trace", f"{path}:target")
    assert r.returncode == 0, r.stderr
    assert "grid (2, 2) = 4 steps" in r.stdout


def test_missing_file_and_malformed_target():
    assert "does not exist" in _kernelsim("trace", "nope.py:f").stderr
    r = _kernelsim("trace", "nocolon")
    assert r.returncode == 2 and "is not FILE.py:FUNC" in r.stderr


def test_out_of_bounds_index_map_exits_2_naming_the_operand(tmp_path):
    path = tmp_path / "oob.py"
    path.write_text(
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import pallas as pl\n"
        "def k(x_ref, o_ref):\n    o_ref[...] = x_ref[...]\n"
        "def fn(x):\n"
        "    return pl.pallas_call(k, grid=(4,),\n"
        "        in_specs=[pl.BlockSpec((8, 128), lambda i: (2 * i, 0))],\n"
        "        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),\n"
        "        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)\n"
        "def target():\n    return fn, (jnp.zeros((32, 128)),)\n")
    r = _kernelsim("trace", f"{path}:target")
    assert r.returncode == 2
    assert "operand 'x_ref'" in r.stderr and "grid step 2" in r.stderr


def test_verify_agrees_with_the_interpreter():
    r = _kernelsim("verify", f"{EXAMPLES}:block_sparse_target")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok") == 3 and "MISMATCH" not in r.stdout


def test_a_call_without_a_grid_says_so_in_its_header():
    """Its header read "grid () = 1 steps" (issue 50)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    import kernelsim

    def double(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def fn(x):
        return pl.pallas_call(double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x)

    head = str(kernelsim.trace(fn, jnp.ones((8, 128), jnp.float32))).splitlines()[0]
    assert "'double'  no grid: 1 step  semantics" in head, head
