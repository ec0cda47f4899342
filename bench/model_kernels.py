"""Kernels that test kernelsim's TPU time model beyond the families it is fitted on, and the
kernels whose VMEM figure the compiler is asked for (``bench/tpu_perf.py``).

Each ``*_call(config, interpret)`` returns ``(fn, args)``: the kernel over random operands of
the row's ``config`` (a dict of plain JSON values, so a recorded row rebuilds its call). The
families: ``softmax``, ``layer_norm``, ``fused_elementwise`` (x * sigmoid(x) * y), ``transpose``,
``matmul_dtype`` (a float32 matmul at a given ``lax.Precision``, or int8 x int8 -> int32),
``batched_matmul`` and ``gather`` (rows of a table picked by scalar-prefetched ids). The VMEM
probes (``rms_norm_residual``, ``sigmoid_bce``, ``pairwise_distance``) are this file's own
kernels of the computations PallasBench (github.com/Tyronita/PallasBench,
``pallasbench/kernels/level2``) benchmarks, at block sizes its kernels use.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _normal(i: int, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(i), shape, jnp.float32).astype(dtype)


def _row_spec(block_rows: int, cols: int) -> pl.BlockSpec:
    return pl.BlockSpec((block_rows, cols), lambda i: (i, 0))


def _rows_call(kernel, config, inputs, interpret, params=None):
    """``kernel`` over row blocks of ``config["block"]`` rows of each (rows, cols) input,
    (1, cols) inputs whole (a weight), writing one (rows, cols) output."""
    rows, cols = inputs[0].shape
    br = config["block"]
    specs = [pl.BlockSpec((1, cols), lambda i: (0, 0)) if x.shape[0] == 1 else
             _row_spec(br, cols) for x in inputs]
    return pl.pallas_call(kernel, grid=(rows // br,), in_specs=specs,
                          out_specs=_row_spec(br, cols),
                          out_shape=jax.ShapeDtypeStruct((rows, cols), inputs[0].dtype),
                          compiler_params=params, interpret=interpret), tuple(inputs)


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - x.max(axis=1, keepdims=True))
    o_ref[...] = e / e.sum(axis=1, keepdims=True)


def layer_norm_kernel(x_ref, w_ref, b_ref, o_ref, *, eps=1e-5):
    x = x_ref[...]
    mean = x.mean(axis=1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=1, keepdims=True)
    o_ref[...] = centred * jax.lax.rsqrt(var + eps) * w_ref[...] + b_ref[...]


def fused_elementwise_kernel(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x * jax.nn.sigmoid(x) * y_ref[...]


def rms_norm_residual_kernel(x_ref, r_ref, o_ref, *, eps=1e-5):
    x = x_ref[...]
    o_ref[...] = x * jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + eps) + r_ref[...]


def sigmoid_bce_kernel(logits_ref, targets_ref, o_ref):
    """Binary cross-entropy of sigmoid(logits), elementwise, through a log-sum-exp shifted by
    max(-z, 0) (so no exp overflows): two values, the shift and the loss term, are each read
    by more than one operation, as in PallasBench's kernel."""
    z, t = logits_ref[...], targets_ref[...]
    shift = jnp.maximum(-z, 0.0)
    softplus = shift + jnp.log(jnp.exp(-shift) + jnp.exp(-z - shift))
    o_ref[...] = softplus - t * z + t * softplus


def pairwise_distance_kernel(x_ref, o_ref):
    x = x_ref[...]
    diff = x[:, None, :] - x[None, :, :]
    o_ref[...] = jnp.sqrt(jnp.sum(diff * diff, axis=-1) + 1e-8)


def softmax_call(config, interpret, params=None):
    return _rows_call(softmax_kernel, config, [_normal(0, config["shape"])], interpret, params)


def layer_norm_call(config, interpret, params=None):
    cols = config["shape"][1]
    return _rows_call(layer_norm_kernel, config,
                      [_normal(0, config["shape"]), _normal(1, (1, cols)), _normal(2, (1, cols))],
                      interpret, params)


def fused_elementwise_call(config, interpret, params=None):
    return _rows_call(fused_elementwise_kernel, config,
                      [_normal(0, config["shape"]), _normal(1, config["shape"])], interpret, params)


def rms_norm_residual_call(config, interpret, params=None):
    return _rows_call(rms_norm_residual_kernel, config,
                      [_normal(0, config["shape"]), _normal(1, config["shape"])], interpret, params)


def sigmoid_bce_call(config, interpret, params=None):
    return _rows_call(sigmoid_bce_kernel, config,
                      [_normal(0, config["shape"]), _normal(1, config["shape"])], interpret, params)


def pairwise_distance_call(config, interpret, params=None):
    n, d = config["shape"]
    return pl.pallas_call(pairwise_distance_kernel, grid=(1,),
                          in_specs=[pl.BlockSpec((n, d), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((n, n), lambda i: (0, 0)),
                          out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
                          compiler_params=params, interpret=interpret), (_normal(0, (n, d)),)


def transpose_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def transpose_call(config, interpret, params=None):
    n, b = config["n"], config["block"]
    return pl.pallas_call(transpose_kernel, grid=(n // b, n // b),
                          in_specs=[pl.BlockSpec((b, b), lambda i, j: (i, j))],
                          out_specs=pl.BlockSpec((b, b), lambda i, j: (j, i)),
                          out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
                          compiler_params=params, interpret=interpret), (_normal(0, (n, n)),)


def matmul_kernel(a_ref, b_ref, o_ref, acc_ref, *, precision):
    """One (bm, bn) output block, accumulated over the k blocks (the last grid axis)."""
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=precision,
                            preferred_element_type=acc_ref.dtype)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul_dtype_call(config, interpret, params=None):
    """An (n, n) x (n, n) matmul of ``config["dtype"]`` ("float32" at ``config["precision"]``,
    a ``lax.Precision`` name, or "int8", accumulated in int32) in (bm, bk, bn) blocks."""
    n, bm, bk, bn = config["n"], config["bm"], config["bk"], config["bn"]
    if config["dtype"] == "int8":
        a, b = (jax.random.randint(jax.random.key(i), (n, n), -128, 128, jnp.int8)
                for i in range(2))
        acc, precision = jnp.int32, None
    else:
        a, b = (_normal(i, (n, n), config["dtype"]) for i in range(2))
        acc, precision = jnp.float32, jax.lax.Precision[config.get("precision", "DEFAULT")]
    params = params or pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "arbitrary"))
    return pl.pallas_call(
        functools.partial(matmul_kernel, precision=precision), grid=(n // bm, n // bn, n // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), acc), scratch_shapes=[pltpu.VMEM((bm, bn), acc)],
        compiler_params=params, interpret=interpret), (a, b)


def batched_matmul_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)


def batched_matmul_call(config, interpret, params=None):
    """``config["batch"]`` bfloat16 (n, k) x (k, n) products, each in (bm, bn) output blocks
    with the whole k in one block."""
    batch, n, k, bm, bn = (config[x] for x in ("batch", "n", "k", "bm", "bn"))
    a, b = _normal(0, (batch, n, k), jnp.bfloat16), _normal(1, (batch, k, n), jnp.bfloat16)
    return pl.pallas_call(
        batched_matmul_kernel, grid=(batch, n // bm, n // bn),
        in_specs=[pl.BlockSpec((None, bm, k), lambda g, i, j: (g, i, 0)),
                  pl.BlockSpec((None, k, bn), lambda g, i, j: (g, 0, j))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda g, i, j: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((batch, n, n), jnp.bfloat16),
        compiler_params=params, interpret=interpret), (a, b)


def gather_kernel(ids_ref, table_ref, o_ref):
    del ids_ref  # read by the index map only
    o_ref[...] = table_ref[...]


def gather_call(config, interpret, params=None):
    """Rows ``ids`` of a float32 (vocab, 1, dim) table, one row a grid step, its index map
    reading the scalar-prefetched ids (an embedding lookup)."""
    vocab, dim, tokens = config["vocab"], config["dim"], config["tokens"]
    table = _normal(0, (vocab, 1, dim))
    ids = jax.random.randint(jax.random.key(1), (tokens,), 0, vocab, jnp.int32)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(tokens,),
        in_specs=[pl.BlockSpec((None, 1, dim), lambda t, ids: (ids[t], 0, 0))],
        out_specs=pl.BlockSpec((None, 1, dim), lambda t, ids: (t, 0, 0)))
    return pl.pallas_call(gather_kernel, grid_spec=grid_spec,
                          out_shape=jax.ShapeDtypeStruct((tokens, 1, dim), jnp.float32),
                          compiler_params=params, interpret=interpret), (ids, table)


# family -> its builder (the held-out rows of bench/tpu_perf.py)
HELD_OUT = {"softmax": softmax_call, "layer_norm": layer_norm_call,
            "fused_elementwise": fused_elementwise_call, "transpose": transpose_call,
            "matmul_dtype": matmul_dtype_call, "batched_matmul": batched_matmul_call,
            "gather": gather_call}
# kernel -> its builder, for the compiler's VMEM figure (bench/tpu_perf.py vmem_figures)
VMEM_PROBES = {**HELD_OUT, "rms_norm_residual": rms_norm_residual_call,
               "sigmoid_bce": sigmoid_bce_call, "pairwise_distance": pairwise_distance_call}
