"""The JAX-internals adapter (kernelsim/adapter.py) and the modules reading it: what kernelsim
reads from a pallas_call.

Runs on every supported release (``adapter.SUPPORTED_JAX``; ``make test`` runs both ends), so a JAX
upgrade that moves a field shows up here first.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim import adapter
from kernelsim import examples as ex
from kernelsim.check import interpret_mode
from kernelsim.find import call_model, calls, index_maps
from kernelsim.find.flops import count_flops


def _captured(fn, *args):
    found = []

    def handler(call_args, params):
        found.append(adapter.Captured(call_args, params))
        return calls.zeros_for(params)

    with adapter.capturing(handler):
        fn(*args)
    return found


def test_capturing_restores_the_primitive_impl_even_on_error():
    before = pl.pallas_call_p.impl

    def boom(x, y):
        ex.add(x, y, (8, 128))
        raise RuntimeError("user error")

    with pytest.raises(RuntimeError, match="user error"):
        kernelsim.trace(boom, jnp.zeros((8, 128)), jnp.zeros((8, 128)))
    assert pl.pallas_call_p.impl is before
    np.testing.assert_array_equal(ex.add(jnp.ones((8, 128)), jnp.ones((8, 128)), (8, 128),
                                         interpret=True), 2.0)


def test_to_model_reads_names_roles_spaces_blocks_and_semantics():
    def kernel(idx_ref, x_ref, w_ref, o_ref, acc_ref, sem):
        del idx_ref, x_ref, w_ref, o_ref, acc_ref, sem

    def fn(idx, x, w):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(2, 4),
            in_specs=[pl.BlockSpec((None, pl.Element(16, (0, 8)), 128),
                                   lambda b, i, idx: (b, idx[i], 0)),
                      pl.BlockSpec((8, 128), lambda b, i, idx: (0, 0),
                                   memory_space=pltpu.SMEM, pipeline_mode=pl.Buffered(1))],
            out_specs=pl.BlockSpec((None, 8, 128), lambda b, i, idx: (b, i, 0)),
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())])
        return pl.pallas_call(
            kernel, grid_spec=spec, name="probe",
            out_shape=jax.ShapeDtypeStruct((2, 32, 128), jnp.float32),
            compiler_params=pltpu.CompilerParams(dimension_semantics=(
                pltpu.GridDimensionSemantics.PARALLEL, "arbitrary")))(idx, x, w)

    idx = jnp.array([0, 8, 16, 24], jnp.int32)
    (cap,) = _captured(fn, idx, jnp.zeros((2, 32, 128)), jnp.zeros((8, 128)))
    call = call_model.to_model(cap.args, cap.params)
    assert call.name == "probe"
    assert call.grid == (2, 4)
    assert call.dimension_semantics == ("parallel", "arbitrary")
    assert [(o.name, o.role, o.memory_space) for o in call.operands] == [
        ("idx_ref", "scalar_prefetch", "smem"), ("x_ref", "input", "vmem"),
        ("w_ref", "input", "smem"), ("o_ref", "output", "vmem"),
        ("acc_ref", "scratch", "vmem"), ("sem", "scratch", "semaphore")]
    x = call.operands[1]
    assert [d.kind for d in x.block_dims] == ["squeezed", "element", "blocked"]
    assert x.block_dims[1].padding == (0, 8)
    assert x.block_shape == (None, 16, 128)
    np.testing.assert_array_equal(x.block_indices[:5], [[0, 0, 0], [0, 8, 0], [0, 16, 0],
                                                         [0, 24, 0], [1, 0, 0]])
    assert call.operands[2].buffer_count == 1
    np.testing.assert_array_equal(call.operands[0].value, idx)


def test_element_blocks_count_in_bounds_bytes_of_the_padded_window():
    def fn(x):
        return pl.pallas_call(
            lambda x_ref, o_ref: None, grid=(4,),
            in_specs=[pl.BlockSpec((pl.Element(16, (0, 8)), 128), lambda i: (i * 8, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32))(x)
    x = kernelsim.trace(fn, jnp.zeros((32, 128))).calls[0].operand("x_ref")
    # windows [0,16) [8,24) [16,32) [24,40): the last has 8 rows beyond the array
    assert x.hbm_read_bytes == (16 + 16 + 16 + 8) * 128 * 4


def test_constant_and_prefetch_maps_evaluate_over_the_grid():
    t = kernelsim.trace(*ex.block_sparse_target()[:1], *ex.block_sparse_target()[1])
    call = t.calls[0].call
    counts, rows, cols = ex.block_band_pattern(8, 3)
    x = call.operands[3]
    np.testing.assert_array_equal(x.block_indices, np.stack([rows, cols], 1))


def test_count_flops_handles_dot_elementwise_reduce_scan_and_cond():
    def kernel(x_ref, o_ref):
        x = x_ref[...]                       # (8, 128): data movement, free
        y = jnp.dot(x, x.T)                  # 2 * 8 * 8 * 128
        z = jnp.exp(y) + 1.0                 # 2 * 64
        s = jnp.sum(z)                       # 64 (per input element)

        def body(c, _):
            return c * 2.0, None             # 1 per iteration

        s, _ = jax.lax.scan(body, s, None, length=5)
        s = jax.lax.cond(s > 0, lambda v: v * 3.0 + 1.0, lambda v: v, s)  # max(2, 0)
        o_ref[...] = jnp.broadcast_to(s, o_ref.shape)

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))(x)

    (cap,) = _captured(fn, jnp.zeros((8, 128)))
    flops, matmuls, *_ = count_flops(cap.params["jaxpr"])
    assert [(m.dtype, m.flops, m.k_major) for m in matmuls] == [("float32", 2 * 8 * 8 * 128, True)]
    assert flops == 2 * 8 * 8 * 128 + 2 * 64 + 64 + 5 + 2 + 1  # + the cond's s > 0


def test_in_row_major_order_drops_parallel_semantics():
    (cap,) = _captured(ex.matmul, jnp.zeros((256, 256)), jnp.zeros((256, 256)))
    params = interpret_mode.in_row_major_order(cap.params)
    assert params["compiler_params"].dimension_semantics is None
    assert cap.params["compiler_params"].dimension_semantics == (
        "parallel", "parallel", "arbitrary")


def test_uses_manual_dma():
    (plain,) = _captured(ex.matmul, jnp.zeros((256, 256)), jnp.zeros((256, 256)))
    assert not call_model.uses_manual_dma(plain.params)

    def fn(x):
        return pl.pallas_call(lambda x_ref, o_ref: None,
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
    (manual,) = _captured(fn, jnp.zeros((8, 128)))
    assert call_model.uses_manual_dma(manual.params)


def test_recording_restores_the_interpreter_callbacks():
    tpu_interpret = adapter.tpu_interpret
    before = (tpu_interpret.get, tpu_interpret.store)
    sink = []
    with interpret_mode.recording_interpret_copies(sink, lambda: 0):
        assert tpu_interpret.get is not before[0]
    assert (tpu_interpret.get, tpu_interpret.store) == before


def _project_python_files() -> list:
    """The repository's own .py files (tracked or new, not ignored: no venvs, no builds)."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "*.py"], cwd=repo, capture_output=True, text=True, check=True)
    return [repo / line for line in listed.stdout.splitlines() if (repo / line).exists()]


def test_only_the_adapter_imports_jax_internals():
    import re

    pattern = re.compile(r"^\s*(from|import)\s+jax\._src", re.M)
    offenders = [str(p) for p in _project_python_files()
                 if p.parts[-2:] != ("kernelsim", "adapter.py") and pattern.search(p.read_text())]
    assert offenders == [], f"jax._src is imported outside kernelsim/adapter.py: {offenders}"


def test_kernelsim_never_switches_on_the_jax_version_string():
    """Release differences are feature-detected in the adapter, not branched on elsewhere."""
    import re
    from pathlib import Path

    pattern = re.compile(r"__version__|version_info")
    repo = Path(__file__).resolve().parents[2]
    offenders = [str(p) for p in _project_python_files()
                 if p.relative_to(repo).parts[0] == "kernelsim"
                 and p.name != "adapter.py" and pattern.search(p.read_text())]
    assert offenders == [], f"kernelsim reads a version string: {offenders}"


def test_supported_range_matches_the_pins():
    """The newest supported JAX is the course's pin; the oldest is what `make test` checks too."""
    import re
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"jax[cpu]=={adapter.SUPPORTED_JAX[-1]}" in deps
    compat = re.search(r"^COMPAT_JAX\s*:=\s*(\S+)", (repo / "Makefile").read_text(), re.M)
    assert compat and compat.group(1) == adapter.SUPPORTED_JAX[0]


@pytest.mark.parametrize("index_map", [
    lambda i, j, p: (jax.lax.div(i - 5, 3) + 2, jax.lax.rem(j - 7, 4) + 3),  # truncation
    lambda i, j, p: (jnp.where(i > j, i - j, j - i), jnp.minimum(p[i], 9) // 2),
    lambda i, j, p: ((i * 1_000_000_007) % 16, (-j) // 3 + 5),  # int32 wrap, floor division
    lambda i, j, p: (jnp.clip(i * 2 - 3, 0, 6), p[(i + j) % 6] ^ 1),
])
def test_numpy_index_map_evaluation_equals_jax(index_map):
    """Index maps run in numpy over the whole grid; JAX's own evaluation is the judge."""
    prefetch = jnp.array([4, 11, 0, 7, 2, 9], jnp.int32)  # p[7] reads past the end: clamped

    def kernel(p_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def fn(p, x):
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(8, 8),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j, p: index_map(i, j, p))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j, p: (i, j)))
        return pl.pallas_call(kernel, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct((64, 1024), x.dtype))(p, x)

    (found,) = _captured(fn, prefetch, jnp.zeros((16 * 8, 11 * 128), jnp.int8))
    bm = found.params["grid_mapping"].block_mappings[0]
    points = np.indices((8, 8)).reshape(2, -1).T
    cols = [points[:, 0].astype(np.int32), points[:, 1].astype(np.int32)]
    by_numpy = index_maps.scalar_program(bm.index_map_jaxpr, cols + [np.asarray(prefetch)])
    by_jax = index_maps.evaluate_with_jax(bm.index_map_jaxpr, 2, cols, [np.asarray(prefetch)])
    for n, j in zip(by_numpy[:2], by_jax, strict=True):
        np.testing.assert_array_equal(np.broadcast_to(n, (64,)), j)
