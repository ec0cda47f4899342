"""Assignment 14, kernels in production (lesson 15): an int8 matmul with one scale per output
column, and the decode-time append to a paged KV cache.

- ``int8_matmul_per_channel``: ``(x @ wq) * scale`` with ``wq`` int8 ``(K, N)`` and ``scale``
  ``(1, N)`` float32. Lesson 15 dequantized every weight block before its dot (one scale per
  block of rows); with one scale per column the scale is constant along K, so it can be
  applied once per output block, after the accumulation. Rules: the tiled matmul's grid, and
  ``wq`` read as int8 at most once per row block (a kernel fed float32 weights dequantized
  outside reads four times the bytes, and the shared work rules flag the outside compute).
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


# ----------------------------------------------------------------------------- task 2: append
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
