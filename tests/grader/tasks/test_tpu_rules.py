"""What a TPU refuses or gets wrong, caught on a CPU (issue 33: the course's first run on a TPU
v5e, jax 0.10.2).

- Dot precision. Mosaic refuses a bfloat16 dot at "highest" ("Bad lhs type"), and a float32
  dot at JAX's default precision is one bfloat16 pass on a TPU. The CPU lowering of a kernel
  for TPU accepts both (the refusal is in the chip's compiler), so the dots' precisions are
  read from the traced program: the instructor solutions' bfloat16 dots carry none, their
  float32 dots "highest". The grader traced every learner at a process-wide "highest", which
  made every bfloat16 matmul solution one that Mosaic refuses; this test failed then.
- An index map that reads a 2-D scalar-prefetch table halted a TPU v5e's core
  (kv_cache_append); the check refuses it (rule dependent_prefetch_read), and a dot at a precision a
  TPU gets wrong ("dot precision right on a TPU").
- A strided ref read (``pl.ds(r, 8, stride=4)``) Mosaic lowers only of 32-bit data in a ref
  exactly 128 lanes wide: pool_rows's solution read so failed to compile on the chip, for
  bfloat16 ("Strided load with non 32-bit data") and for a float32 block of 256 columns ("The
  last dim size is not 128"); TPU interpret mode runs it right. Rule strided_load.
"""

from __future__ import annotations

import gradertools
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grader import tasks
from grader.calling import eqns, kernel_bodies, trace_case

pytestmark = pytest.mark.interpret

# every task whose instructor kernel multiplies, with its assignment
MATMUL_TASKS = {
    "matmul": "04_memory_spaces", "matmul_bias_relu": "04_memory_spaces",
    "block_sparse_matmul": "05_scalar_prefetch", "grouped_matmul": "05_scalar_prefetch",
    "matmul_tuned": "06_performance", "matmul_costed": "06_performance",
    "flash_attention": "07_flash_attention", "dropout_attention": "07_flash_attention",
    "gpu_matmul": "11_gpu", "matmul_bias_relu_cores": "12_kernel_api",
    "int8_matmul_per_channel": "14_production_kernels", "w8a8_matmul": "14_production_kernels",
}


def _precision(p) -> str:
    if p is None:
        return "default"
    names = {str(getattr(x, "name", x)).lower() for x in (p if isinstance(p, tuple) else (p,))}
    return "default" if names == {"default"} else "/".join(sorted(names))


@pytest.fixture(scope="module")
def solutions() -> dict:
    found = {}
    for assignment in sorted(set(MATMUL_TASKS.values())):
        found.update(gradertools.solutions(assignment))
    return found


@pytest.mark.parametrize("task_id", sorted(MATMUL_TASKS))
def test_every_solution_dot_has_the_precision_a_tpu_compiles_exactly(task_id, solutions):
    task = tasks.get(task_id)
    seen = set()
    for case in task.cases:
        arrays = [jnp.asarray(v) for v in task.inputs(case).values()]
        traced = trace_case(task, solutions[task_id], arrays, case.params)
        assert traced.error is None, traced.error
        for body in kernel_bodies(traced.program):
            for e in eqns(body):
                if e.primitive.name != "dot_general":
                    continue
                dtypes = {str(v.aval.dtype) for v in e.invars[:2]}
                precision = _precision(e.params["precision"])
                seen.add(frozenset(dtypes))
                if dtypes & {"bfloat16", "float16"}:
                    assert precision == "default", (case.name, dtypes, precision)
                if dtypes == {"float32"}:
                    assert precision == "highest", (case.name, dtypes, precision)
    assert seen, f"{task_id}: no dot in its kernel"


def test_a_bfloat16_dot_at_highest_is_refused(solutions):
    planted = gradertools.planted(
        "04_memory_spaces", gradertools.run("04_memory_spaces"), "matmul_solution",
        ("precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None",
         "precision = jax.lax.Precision.HIGHEST"))
    message = gradertools.fails("matmul", planted, "dot precision right on a TPU",
                                hidden=True)
    assert "FAIL" in message


def test_a_float32_dot_at_the_default_precision_is_refused():
    planted = gradertools.planted(
        "04_memory_spaces", gradertools.run("04_memory_spaces"), "matmul_solution",
        ("precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None",
         "precision = None"))
    message = gradertools.fails("matmul", planted, "dot precision right on a TPU")
    assert "pass precision=jax.lax.Precision.HIGHEST" in message


# kv_cache_append's index maps that halted a TPU v5e core (issue 33): the page read from the
# table at an index read from the positions, the table 2-D (the first solution) or 1-D
DEPENDENT_READS = {
    "2-D": ("(page_indices, positions, cache, new_rows)",
            "table_ref[s, pos_ref[s] // page_size]"),
    "1-D": ("(page_indices.reshape(-1), positions, cache, new_rows)",
            "table_ref[s * page_indices.shape[1] + pos_ref[s] // page_size]"),
}


@pytest.mark.parametrize("form", sorted(DEPENDENT_READS))
def test_an_index_map_reading_prefetch_at_a_prefetched_index_is_refused(form):
    """Every such form halted the chip's core; the check refuses each, though TPU interpret
    mode runs it right (bench/recorded/kv_halt_probe-v5e.json)."""
    call_args, index = DEPENDENT_READS[form]
    notebook = gradertools.run("14_production_kernels")
    planted = gradertools.planted(
        "14_production_kernels", notebook, "kv_cache_append_solution",
        ("(pages, positions, cache, new_rows)", call_args),
        ("(pages_ref[s], 0, 0))", f"({index}, 0, 0))"),
        ("lambda s, pages_ref, pos_ref:", "lambda s, table_ref, pos_ref:"))
    message = gradertools.fails("kv_cache_append", planted, "dependent_prefetch_read")
    assert "at an index it read from scalar prefetch" in message and "before the call" in message
    cache, rows, table, pos = (jnp.asarray(v) for v in tasks.get("kv_cache_append").inputs(
        tasks.get("kv_cache_append").cases[0]).values())
    assert jnp.array_equal(planted(cache, rows, table, pos),
                           notebook["kv_cache_append"](cache, rows, table, pos))



# pool_rows as its solution first read each group: one strided read per row of a group
STRIDED_POOL = ("""        x = x_ref[...].astype(jnp.float32)
        rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        out_row = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        pooled = jnp.zeros(o_ref.shape, jnp.float32)
        for j in range(out_rows):
            group = (rows >= 4 * j) & (rows < 4 * j + 4)
            total = jnp.sum(jnp.where(group, x, 0.0), axis=0, keepdims=True)
            pooled = jnp.where(out_row == j, total, pooled)
        o_ref[...] = (pooled / 4).astype(o_ref.dtype)""",
                """        total = sum(x_ref[pl.ds(r, out_rows, stride=4), :].astype(jnp.float32)
                    for r in range(4))
        o_ref[...] = (total / 4).astype(o_ref.dtype)""")


def test_a_strided_read_mosaic_cannot_lower_is_refused():
    """pool_rows read with strides: right values, refused on a 256-column float32 block (the
    visible case) and on bfloat16 (hidden), as the chip refused them."""
    notebook = gradertools.run("09_debugging")
    planted = gradertools.planted("09_debugging", notebook, "pool_rows_solution", STRIDED_POOL)
    message = gradertools.fails("pool_rows", planted, "strided_load")
    assert "of a 32x256 float32 ref: its last dim is 256, not 128" in message
    message = gradertools.fails("pool_rows", planted, "strided_load", hidden=True)
    assert "bfloat16 is not 32-bit" in message
    x = jnp.asarray(tasks.get("pool_rows").inputs(tasks.get("pool_rows").cases[0])["x"])
    assert jnp.array_equal(planted(x), notebook["pool_rows"](x))


def test_a_strided_read_of_32_bit_data_128_lanes_wide_passes():
    """The one strided read Mosaic lowers: float32, a ref exactly 128 lanes wide."""
    from grader.facts.work import strided_refs

    def body(width, dtype):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[pl.ds(1, 8, stride=4), :]
        return jax.make_jaxpr(lambda x: pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, width), dtype),
            interpret=pltpu.InterpretParams())(x))(jnp.zeros((32, width), dtype))

    [call] = [e for e in eqns(body(128, jnp.float32)) if e.primitive.name == "pallas_call"]
    assert strided_refs(call.params["jaxpr"]) == []
    [call] = [e for e in eqns(body(128, jnp.bfloat16)) if e.primitive.name == "pallas_call"]
    assert strided_refs(call.params["jaxpr"]) == [
        "a strided read (stride 4) of a 32x128 bfloat16 ref: bfloat16 is not 32-bit"]
