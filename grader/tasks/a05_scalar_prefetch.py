"""Assignment 05, scalar prefetch: its tasks, cases and structural rules."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from grader import calling
from grader.tasks.core import (
    as_f32,
    block_is,
    cdiv,
    drawn_values,
    grid_is,
    make_case,
    matmul_reference,
    nbytes_of,
    normal_array,
    read_budget,
    register_task,
    role_count,
    single_call,
    total_budget,
)

A5 = "05_scalar_prefetch"


def _make_bag(rng, case):
    v, d = case.arrays["table"]
    (n,) = case.arrays["ids"]
    ids = rng.integers(0, v, size=n).astype(np.int32)
    if n > 2:
        ids[1] = ids[0]  # a row twice in a row: counted twice, though the pipeline skips the copy
    return {"table": normal_array(rng, (v, d), case.dtype), "ids": ids}


def _bag_ref(table, ids, bag):
    rows = as_f32(table)[ids]
    return rows.reshape(-1, bag, table.shape[1]).sum(axis=1)


def _bag_rules(call, case, rules, inputs):
    (_, d), (n,), bag = case.arrays["table"], case.arrays["ids"], case.params["bag"]
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (ids in SMEM)"))
    rules.append(grid_is(call, (n // bag, bag)))
    # one row of the table viewed as (V, 1, D): a (1, D) block breaks the TPU's (8, 128) rule
    rules.append(block_is(call, "input", 0, (None, 1, d), "table (viewed as (V, 1, D))"))
    rules.append(read_budget(call, "input", 0, n * nbytes_of((1, d), case.dtype),
                             "table (one row per id, never the whole table)"))
    # each bag's float32 sum leaves the chip once: its block stays put while j walks the bag
    rules.extend(total_budget(call, None, (n // bag) * nbytes_of((1, d), "float32")))


def _make_bsmm(rng, case):
    (m, k), (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk = case.params["bm"], case.params["bk"]
    # _density: the share of non-zero blocks (a private param: calling.with_host_last keeps it from
    # the learner's function); 0 leaves no non-zero block at all
    density = case.params.get("_density", 0.5)
    mask = rng.random((m // bm, k // bk)) < density
    mask[0, :] = False  # a row of blocks with no non-zero block
    if density > 0:
        mask[-1, -1] = True
    a = drawn_values(rng, (m, k), case)
    full = np.kron(mask, np.ones((bm, bk), bool))
    a = np.where(full, a, np.zeros_like(a))
    return {"a": a, "b": drawn_values(rng, (k, n), case), "block_mask": mask.astype(np.int32)}


def _bsmm_rules(call, case, rules, inputs):
    _, (_, n) = case.arrays["a"], case.arrays["b"]
    bm, bk, bn = case.params["bm"], case.params["bk"], case.params["bn"]
    mask = np.asarray(inputs["block_mask"])
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (block indices)"))
    per_row = np.maximum(mask.sum(axis=1), 1)
    budget = int(per_row.sum()) * cdiv(n, bn) * nbytes_of((bm, bk), case.dtype)
    rules.append(read_budget(call, "input", 0, budget,
                             f"A (only its {int(mask.sum())} non-zero blocks, per column block)"))


def _bsmm_ref(a, b, block_mask, **_):
    return matmul_reference(a, b)


def _make_gmm(rng, case):
    (m, k), (g, _, n) = case.arrays["x"], case.arrays["w"]
    bm = case.params["bm"]
    blocks = m // bm
    if case.values == "skewed":  # one group takes almost every block; most groups are empty
        sizes = np.zeros(g, np.int64)
        sizes[g // 2], sizes[-1] = 1, 1
        sizes[0] = blocks - sizes.sum()
        sizes *= bm
    else:
        cuts = np.sort(rng.choice(np.arange(1, blocks), size=g - 1, replace=False))
        sizes = np.diff(np.concatenate([[0], cuts, [blocks]])) * bm
    return {"x": normal_array(rng, (m, k), case.dtype), "w": normal_array(rng, (g, k, n),
                                                                          case.dtype),
            "group_sizes": sizes.astype(np.int32)}


def _gmm_ref(x, w, group_sizes, **_):
    gid = np.repeat(np.arange(w.shape[0]), np.asarray(group_sizes))
    return jnp.einsum("mk,mkn->mn", as_f32(x), as_f32(w[gid]), precision="highest",
                      preferred_element_type=jnp.float32).astype(x.dtype)


def _gmm_rules(call, case, rules, inputs):
    (m, k), (_, _, n) = case.arrays["x"], case.arrays["w"]
    bm, bn = case.params["bm"], case.params["bn"]
    rules.append(role_count(call, "scalar_prefetch", 1, "scalar prefetch (group of each block)"))
    rules.append(grid_is(call, (m // bm, cdiv(n, bn))))
    rules.append(read_budget(call, "input", 1, (m // bm) * nbytes_of((k, n), case.dtype),
                             "w (only the block's own group, never all groups)"))


register_task(
    id="embedding_bag", assignment=A5, title="Embedding bag: each bag's rows gathered and summed",
    prefetch="the row ids", tolerance="reduction",
    reference=_bag_ref,
    make=_make_bag,
    cases=(
        make_case("v0", 12, "float32", {"table": (32, 128), "ids": (24,)}, bag=4),
        make_case("h0", 221, "float32", {"table": (100, 256), "ids": (40,)}, True, bag=5),
        make_case("h1", 222, "bfloat16", {"table": (64, 128), "ids": (32,)}, True, bag=8),
        # bags of one: the plain gather, every output row a single table row
        make_case("h2", 223, "float32", {"table": (8, 128), "ids": (3,)}, True, bag=1),
        # one bag of everything: the output block stays on chip for the whole grid
        make_case("h3", 224, "float32", {"table": (16, 128), "ids": (12,)}, True, bag=12),
    ),
    structure=single_call(_bag_rules),
)
register_task(
    id="block_sparse_matmul", assignment=A5, title="Block-sparse matmul",
    prefetch="the non-zero blocks' indices and counts per row of blocks",
    kernel_ops=(("dot_general",),), host_inputs=1,
    reference=_bsmm_ref, tolerance="reduction", make=_make_bsmm, invoke=calling.with_host_last,
    cases=(
        # blocks (bm, 128) and (128, bn): the TPU lowering wants lanes in multiples of 128
        make_case("v0", 13, "float32", {"a": (64, 512), "b": (512, 256), "block_mask": (4, 4)},
                  bm=16, bk=128, bn=128),
        # visible: all positive in bfloat16, ~7 of 8 K blocks per row (see h3)
        make_case("v1", 236, "bfloat16", {"a": (128, 1024), "b": (1024, 128), "block_mask": (4, 8)},
                  values="positive", bm=32, bk=128, bn=128, _density=0.9),
        make_case("h0", 231, "float32", {"a": (64, 512), "b": (512, 200), "block_mask": (4, 4)},
                  True, bm=16, bk=128, bn=128),
        make_case("h1", 232, "bfloat16", {"a": (128, 512), "b": (512, 128), "block_mask": (4, 4)},
                  True, bm=32, bk=128, bn=128),
        make_case("h2", 233, "float32", {"a": (96, 384), "b": (384, 256), "block_mask": (6, 3)},
                  True, bm=16, bk=128, bn=128),
        # all positive, ~7 of 8 K blocks per row: a bfloat16 accumulator's roundings add up
        make_case("h3", 234, "bfloat16", {"a": (128, 1024), "b": (1024, 128), "block_mask": (4, 8)},
                  True, values="positive", bm=32, bk=128, bn=128, _density=0.9),
        # no non-zero block anywhere: the output is zeros, and every list still needs a step
        make_case("h4", 235, "float32", {"a": (64, 512), "b": (512, 256), "block_mask": (4, 4)},
                  True, bm=16, bk=128, bn=128, _density=0.0),
    ),
    structure=single_call(_bsmm_rules),
)
register_task(
    id="grouped_matmul", assignment=A5, title="Grouped matmul (one weight per group of rows)",
    prefetch="each row block's group",
    kernel_ops=(("dot_general",),), host_inputs=1,
    reference=_gmm_ref, tolerance="reduction", make=_make_gmm, invoke=calling.with_host_last,
    cases=(
        # more groups than row blocks, some empty: reading every group's weights cannot fit
        make_case("v0", 14, "float32", {"x": (64, 32), "w": (6, 32, 128), "group_sizes": (6,)},
                  values="skewed", bm=16, bn=128),
        make_case("h0", 241, "float32", {"x": (128, 64), "w": (4, 64, 200), "group_sizes": (4,)},
                  True, bm=16, bn=128),
        make_case("h1", 242, "bfloat16", {"x": (64, 64), "w": (2, 64, 128), "group_sizes": (2,)},
                  True, bm=16, bn=128),
        make_case("h2", 243, "float32", {"x": (96, 32), "w": (5, 32, 256), "group_sizes": (5,)},
                  True, bm=8, bn=128),
        make_case("h3", 244, "float32", {"x": (128, 64), "w": (8, 64, 256), "group_sizes": (8,)},
                  True, values="skewed", bm=16, bn=128),
    ),
    structure=single_call(_gmm_rules),
)
