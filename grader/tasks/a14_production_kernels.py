"""Assignment 14, kernels in production (lesson 15): an int8 matmul with one scale per output
column, the same with int8 activations on the MXU's int8 path, and the decode-time append to a
paged KV cache.

- ``int8_matmul_per_channel``: ``(x @ wq) * scale`` with ``wq`` int8 ``(K, N)`` and ``scale``
  ``(1, N)`` float32. Lesson 15 dequantized every weight block before its dot (one scale per
  block of rows); with one scale per column the scale is constant along K, so it can be
  applied once per output block, after the accumulation. Rules: the tiled matmul's grid, and
  ``wq`` read as int8 at most once per row block (a kernel fed float32 weights dequantized
  outside reads four times the bytes, and the shared work rules flag the outside compute).
- ``w8a8_matmul``: ``(xq @ wq) * x_scale * w_scale`` with ``xq`` int8 ``(M, K)`` quantized
  per row (``x_scale`` ``(M, 1)``) and ``wq`` int8 ``(K, N)`` per output column (``w_scale``
  ``(1, N)``), output float32 or bfloat16 (``out_dtype``). Both operands int8 is what the
  int8 rate of v5e and v6e asks for (lesson 15's table). Rules: the tiled grid with k
  "arbitrary", each int8 operand read once per block of the other; from the kernel's jaxpr
  (``body_rules``): every dot ``int8 x int8 -> int32``, an int32 ``(bm, bn)`` scratch as the
  only state across k (no float scratch, the output never read back), the scales read only
  inside a ``pl.when`` branch. The values cannot tell a float accumulator from an int32 one
  (every partial sum here is an integer below 2**24, exact in float32), so the rules do.
- ``kv_cache_append``: every sequence's new key row written into its page at its position,
  in place. Lesson 15 wrote whole pages; a decode step writes one row of a page and must keep
  the page's other rows. Rules: grid ``(S,)``, two scalar-prefetch operands (the page table and
  the positions), and HBM writes of exactly one page per sequence (the cache is the output's
  own buffer, ``input_output_aliases``; a fresh output would be NaN in the unwritten pages);
  like every TPU task, no index map reading a 2-D scalar-prefetch table (``core.work_rules``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from grader.tasks.core import (
    Rule,
    as_f32,
    cdiv,
    grid_is,
    make_case,
    nbytes_of,
    normal_array,
    read_budget,
    register_task,
    role_count,
    single_call,
    total_budget,
)

A14 = "14_production_kernels"


# ----------------------------------------------------------------------------- task 1: int8
def _make_int8(rng, case):
    (m, k), (_, n) = case.arrays["x"], case.arrays["wq"]
    wq = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
    scale = (rng.random((1, n), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    return {"x": normal_array(rng, (m, k), case.dtype), "wq": wq, "scale": scale}


def _int8_reference(x, wq, scale, bm, bn, bk):
    out = jnp.dot(as_f32(x), as_f32(wq), precision="highest") * scale
    return out.astype(jnp.float32)


def _int8_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["x"], case.arrays["wq"]
    bm, bn, bk = case.params["bm"], case.params["bn"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk))))
    rules.append(read_budget(call, "input", 1, cdiv(m, bm) * k * n,
                             "wq (int8, once per row block of x)"))


register_task(
    id="int8_matmul_per_channel", assignment=A14,
    title="int8 weights with one scale per output column, applied once per output block",
    kernel_ops=(("dot_general",), ("mul",)),
    reference=_int8_reference, make=_make_int8,
    tolerance="reduction",
    cases=(
        make_case("v0", 140, "float32", {"x": (128, 256), "wq": (256, 256), "scale": (1, 256)},
                  bm=128, bn=128, bk=128),
        make_case("h0", 1401, "float32", {"x": (64, 512), "wq": (512, 384), "scale": (1, 384)},
                  True, bm=64, bn=128, bk=256),
        make_case("h1", 1402, "float32", {"x": (256, 128), "wq": (128, 128), "scale": (1, 128)},
                  True, bm=128, bn=128, bk=128),
        make_case("h2", 1403, "float32", {"x": (128, 1024), "wq": (1024, 256), "scale": (1, 256)},
                  True, bm=128, bn=256, bk=128),
    ),
    structure=single_call(_int8_rules),
)


# ----------------------------------------------------------------------------- task 2: w8a8
INT8_LARGEST = 127  # symmetric int8: -128 is never used, so -q is always an int8 too


def quantize_int8(a, axis: int):
    """``(q, scale)``: float ``a`` as int8 with one float32 scale per slice along ``axis`` (1:
    one per row, 0: one per column), ``a ≈ q * scale``. The scale maps the slice's largest
    ``|a|`` to 127; an all-zero slice gets scale 0 and q 0 (its division guarded: never 0/0)."""
    scale = jnp.max(jnp.abs(a), axis=axis, keepdims=True) / INT8_LARGEST
    q = jnp.round(a / jnp.where(scale == 0, 1, scale))
    return (jnp.clip(q, -INT8_LARGEST, INT8_LARGEST).astype(jnp.int8),
            scale.astype(jnp.float32))


def _make_w8a8(rng, case):
    """Activations quantized per row and weights per output column, as a server does (the
    weights once, offline; each row of activations as it arrives); with ``values="zero_row"``
    row 1 of the activations is all zeros: its scale is 0."""
    (m, k), (_, n) = case.arrays["xq"], case.arrays["wq"]
    x = rng.standard_normal((m, k), dtype=np.float32)
    if case.values == "zero_row":
        x[1] = 0
    xq, x_scale = quantize_int8(x, axis=1)
    wq, w_scale = quantize_int8(rng.standard_normal((k, n), dtype=np.float32), axis=0)
    return {"xq": np.asarray(xq), "x_scale": np.asarray(x_scale),
            "wq": np.asarray(wq), "w_scale": np.asarray(w_scale)}


def _w8a8_reference(xq, x_scale, wq, w_scale, bm, bn, bk, out_dtype):
    acc = jnp.dot(xq, wq, preferred_element_type=jnp.int32)  # exact: integers, no rounding
    return (acc.astype(jnp.float32) * x_scale * w_scale).astype(out_dtype)


def _w8a8_rules(call, case, rules, inputs):
    (m, k), (_, n) = case.arrays["xq"], case.arrays["wq"]
    bm, bn, bk = case.params["bm"], case.params["bn"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk))))
    semantics = tuple(call.dimension_semantics)
    rules.append(Rule("the K axis carries the accumulator", "grid axis 2 (k) \"arbitrary\"",
                      str(semantics), semantics[2:3] == ("arbitrary",)))
    rules.append(read_budget(call, "input", 0, cdiv(n, bn) * m * k,
                             "xq (int8, once per column block of wq)"))
    rules.append(read_budget(call, "input", 2, cdiv(m, bm) * k * n,
                             "wq (int8, once per row block of xq)"))


INT8_DOT = "int8 x int8 -> int32"  # the MXU's int8 path (``work.dot_types`` words a dot so)
_SCALES = {1: "x_scale", 3: "w_scale"}  # the scales' input numbers


def _w8a8_body_rules(calls, case) -> list[Rule]:
    """What the kernel computes with, from its jaxpr (``verdict.KernelWork``): its dots take
    int8 on both sides into int32; its state across the K steps is an int32 scratch of the
    output block's shape (no floating-point scratch, the output block never read back); the
    scales are read only inside a ``pl.when`` branch (the epilogue), not at every step. Which
    branch it is, the values decide: scales applied at any step but the last miss the sums
    still to come."""
    bm, bn = case.params["bm"], case.params["bn"]
    dots = list(dict.fromkeys(d for c in calls for d in c.dot_types))
    scratch = [s for c in calls for s in c.scratch]
    accumulators = [s for s in scratch if s.dtype == "int32" and s.shape == (bm, bn) and s.read]
    floating = [s for s in scratch if "float" in s.dtype]
    read_back = any(c.outputs_read for c in calls)
    state = [f"{s.dtype} {s.shape} scratch{'' if s.read else ' (never read)'}" for s in scratch]
    state += ["the output block read back"] if read_back else []
    branch_only = {i for c in calls for i in c.branch_only_reads}
    unread = {i for c in calls for i in c.unread}
    every_step = [f"{name} {'never read' if i in unread else 'read at every k step'}"
                  for i, name in _SCALES.items() if i not in branch_only]
    return [
        Rule("the dot takes the MXU's int8 path", f"every dot {INT8_DOT}: the int8 blocks as "
             "they are, preferred_element_type=jnp.int32 (converted to a float first, they "
             "take the float path)", "; ".join(dots) or "no dot",
             bool(dots) and set(dots) == {INT8_DOT}),
        Rule("int32 accumulator across the k steps", f"an int32 ({bm}, {bn}) VMEM scratch the "
             "kernel adds each dot to, no floating-point scratch, the output block only "
             "written", "; ".join(state) or "no scratch",
             bool(accumulators) and not floating and not read_back),
        Rule("scales applied once per output block", "x_scale and w_scale read only inside "
             "the pl.when branch of the last k step, on the finished int32 sum",
             "; ".join(every_step) or "they are", not every_step),
    ]


register_task(
    id="w8a8_matmul", assignment=A14,
    title="int8 activations times int8 weights on the MXU's int8 path: int32 accumulation, "
          "per-row and per-column scales applied once",
    kernel_ops=(("dot_general",), ("mul",)),
    reference=_w8a8_reference, make=_make_w8a8,
    # every output is one exact int32 sum times two float32 scales: a kernel and the reference
    # differ only in the order of those two float32 products (an ulp or two), and in bfloat16
    # in the one rounding after them; "exact" allows both. A float accumulator is just as
    # exact here (sums under 2**24), so the body rules, not the values, catch it
    tolerance="exact",
    cases=(
        make_case("v0", 142, "float32", {"xq": (128, 512), "x_scale": (128, 1),
                                         "wq": (512, 256), "w_scale": (1, 256)},
                  bm=128, bn=128, bk=256, out_dtype="float32"),
        make_case("h0", 1421, "float32", {"xq": (64, 1024), "x_scale": (64, 1),
                                          "wq": (1024, 128), "w_scale": (1, 128)},
                  True, "zero_row", bm=64, bn=128, bk=256, out_dtype="float32"),
        make_case("h1", 1422, "bfloat16", {"xq": (256, 256), "x_scale": (256, 1),
                                           "wq": (256, 384), "w_scale": (1, 384)},
                  True, bm=128, bn=128, bk=128, out_dtype="bfloat16"),
        # one k step: the first step is the last, both pl.when branches run at once
        make_case("h2", 1423, "bfloat16", {"xq": (128, 512), "x_scale": (128, 1),
                                           "wq": (512, 256), "w_scale": (1, 256)},
                  True, "zero_row", bm=32, bn=256, bk=512, out_dtype="bfloat16"),
    ),
    structure=single_call(_w8a8_rules),
    body_rules=_w8a8_body_rules,
)


# ----------------------------------------------------------------------------- task 3: append
def _make_append(rng, case):
    pages, page_size, d = case.arrays["cache"]
    n_seq, slots = case.arrays["page_indices"]
    # distinct pages: no two sequences share one
    table = rng.permutation(pages)[:n_seq * slots].reshape(n_seq, slots).astype(np.int32)
    positions = rng.integers(0, slots * page_size, size=n_seq).astype(np.int32)
    positions[0] = page_size - 1  # the last row of a page
    if n_seq > 1:
        positions[1] = page_size  # the first row of the second page
    return {"cache": normal_array(rng, (pages, page_size, d), case.dtype),
            "new_rows": normal_array(rng, (n_seq, 1, d), case.dtype),
            "page_indices": table, "positions": positions}


def _append_reference(cache, new_rows, page_indices, positions):
    page_size = cache.shape[1]
    pages = page_indices[jnp.arange(page_indices.shape[0]), positions // page_size]
    return cache.at[pages, positions % page_size].set(new_rows[:, 0])


def _append_rules(call, case, rules, inputs):
    (_, page_size, d), (n_seq, slots) = case.arrays["cache"], case.arrays["page_indices"]
    page = nbytes_of((page_size, d), case.dtype)
    tables = nbytes_of((n_seq, slots + 1), "int32")  # the page table and the positions
    rules.append(grid_is(call, (n_seq,)))
    rules.append(role_count(call, "scalar_prefetch", 2,
                            "scalar prefetch (the page table and the positions)"))
    # one page and one new row per sequence read, one page written: never the whole cache
    rules.extend(total_budget(call, read=tables + n_seq * (page + nbytes_of((1, d), case.dtype)),
                              write=n_seq * page))


register_task(
    id="kv_cache_append", assignment=A14,
    title="Append one key row per sequence to a paged KV cache, in place",
    kernel_ops=(),
    reference=_append_reference, make=_make_append,
    cases=(
        make_case("v0", 141, "float32", {"cache": (12, 16, 128), "new_rows": (3, 1, 128),
                                         "page_indices": (3, 4), "positions": (3,)}),
        make_case("h0", 1411, "bfloat16", {"cache": (16, 16, 128), "new_rows": (4, 1, 128),
                                           "page_indices": (4, 3), "positions": (4,)}, True),
        make_case("h1", 1412, "float32", {"cache": (8, 32, 256), "new_rows": (2, 1, 256),
                                          "page_indices": (2, 4), "positions": (2,)}, True),
        make_case("h2", 1413, "float32", {"cache": (4, 16, 128), "new_rows": (1, 1, 128),
                                          "page_indices": (1, 2), "positions": (1,)}, True),
    ),
    structure=single_call(_append_rules),
)
