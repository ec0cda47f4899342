"""The course's GPU kernels at production sizes, for ``bench/gpu_perf.py``.

Two backends of the pinned jax (0.12.0.1):

* **Triton** (``pl.pallas_call``, lesson 11's GPU-safe shape): one program per output block,
  the reduction a ``lax.fori_loop`` inside it, block sizes and ``num_warps``/``num_stages`` in
  ``pltriton.CompilerParams``. Triton stages the loop's loads through shared memory itself.
* **Mosaic GPU** (``plgpu.kernel``): the kernel receives global-memory refs; tiles reach shared
  memory by TMA (``plgpu.emit_pipeline`` or ``plgpu.copy_gmem_to_smem`` and a barrier), the
  tensor cores multiply them with WGMMA into an accumulator held in registers
  (``plgpu.ACC``), and the result leaves through shared memory by TMA.

What these kernels learned from JAX's bundled GPU ops (read, not copied):
``jax/experimental/pallas/ops/gpu/hopper_matmul_mgpu.py`` (swizzle and tiling transforms for
WGMMA operands, the tiled epilogue through shared memory, a warp-specialized pipeline with two
compute warpgroups) and ``attention_mgpu.py`` (online softmax in the WGMMA register layout,
``exp2`` with ``log2(e)`` folded into the scale, P fed to WGMMA from registers).

Every function takes ``interpret``: ``False`` compiles for the GPU; on a CPU the Triton
kernels run with ``interpret=True`` and the Mosaic GPU ones with
``plgpu.InterpretGPUParams()``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from kernelsim.backend import gpu_interpret

LOG2E = math.log2(math.e)


def _grouped_ids(lin, rows, cols, group):
    """Output block (i, j) of linear program ``lin``, ``group`` block rows at a time: programs
    launched together share A's row bands and B's column bands, so L2 serves the repeats."""
    per_group = group * cols
    first = (lin // per_group) * group
    height = jnp.minimum(rows - first, group)
    return first + lin % per_group % height, lin % per_group // height


# ---------------------------------------------------------------------------------------------
# Matmul, Triton


def matmul_triton_kernel(a_ref, b_ref, o_ref, *, bk, b_transposed):
    def step(kk, acc):
        a = a_ref[:, pl.ds(kk * bk, bk)]
        if b_transposed:  # b_ref holds B's column band as (bn, K): K-major
            b = b_ref[:, pl.ds(kk * bk, bk)].T
        else:
            b = b_ref[pl.ds(kk * bk, bk), :]
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, a_ref.shape[1] // bk, step, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def matmul_triton(a, b, *, bm=128, bn=128, bk=64, group=8, num_warps=4, num_stages=3,
                  b_transposed=False, interpret=False):
    """``a @ b``: program p owns output block ``_grouped_ids(p)`` and loops over K in ``bk``
    chunks; A's row band and B's column band are pointers until the loop loads a chunk.

    b_transposed: ``b`` is given as Bᵀ, shape (N, K), so B's chunks are K-major, the operand
    layout float32 (TF32) tensor-core instructions read without a transpose."""
    m, k = a.shape
    n = b.shape[0] if b_transposed else b.shape[1]
    rows, cols = m // bm, n // bn
    ids = functools.partial(_grouped_ids, rows=rows, cols=cols, group=group)
    b_spec = (pl.BlockSpec((bn, k), lambda p: (ids(p)[1], 0)) if b_transposed else
              pl.BlockSpec((k, bn), lambda p: (0, ids(p)[1])))
    return pl.pallas_call(
        functools.partial(matmul_triton_kernel, bk=bk, b_transposed=b_transposed),
        grid=(rows * cols,),
        in_specs=[pl.BlockSpec((bm, k), lambda p: (ids(p)[0], 0)), b_spec],
        out_specs=pl.BlockSpec((bm, bn), lambda p: ids(p)),
        out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        cost_estimate=pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                                      bytes_accessed=(m * k + k * n + m * n) * a.itemsize),
        interpret=interpret,
    )(a, b)


# ---------------------------------------------------------------------------------------------
# Matmul, Mosaic GPU


def _wgmma_transforms(minor_elems, dtype):
    """Tiling and swizzle for a shared-memory tile whose rows hold ``minor_elems`` elements:
    the layout WGMMA reads and TMA writes (the widest swizzle the row allows)."""
    swizzle = plgpu.find_swizzle(minor_elems * jnp.dtype(dtype).itemsize * 8)
    return (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
            plgpu.SwizzleTransform(swizzle))


def matmul_mgpu(a, b, *, tm=128, tn=128, tk=64, stages=4, delay_release=1, interpret=False):
    """``a @ b`` with one warpgroup per CTA: CTA (i, j) pipelines the K axis through shared
    memory (``stages`` TMA copies in flight), WGMMA accumulates the ``(tm, tn)`` block in
    registers, and the block leaves by TMA from shared memory.

    delay_release: steps a slot waits before it is refilled; 0 races the WGMMA still in flight
        (kept as a parameter so lesson 16 and kernelsim's tests can show that race)."""
    m, k = a.shape
    n = b.shape[1]
    dtype = a.dtype
    in_tr = _wgmma_transforms(tk, dtype)
    out_tr = _wgmma_transforms(tn, dtype)

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype),
        grid=(m // tm, n // tn), grid_names=("m", "n"),
        scratch_types=dict(o_smem=plgpu.SMEM((tm, tn), dtype, transforms=out_tr)),
        interpret=gpu_interpret(interpret))
    def kernel(a_gmem, b_gmem, o_gmem, o_smem):
        i, j = lax.axis_index("m"), lax.axis_index("n")

        def accumulate(acc_ref):
            def step(_, a_smem, b_smem):
                plgpu.wgmma(acc_ref, a_smem, b_smem)
                plgpu.wgmma_wait(1)  # the previous step's WGMMA is done, this one may run on

            # the pipeline walks K in order; (i, j) picks this CTA's row band and column band.
            # delay_release=1: a slot is refilled one step late, once the WGMMA reading it has
            # finished (without it the refill races the WGMMA still in flight: wrong values
            # on the H200, bench/recorded/gpu_perf-h200.json, first run)
            plgpu.emit_pipeline(
                step, grid=(k // tk,), max_concurrent_steps=stages,
                in_specs=[plgpu.BlockSpec((tm, tk), lambda kk: (i, kk), transforms=in_tr,
                                          delay_release=delay_release),
                          plgpu.BlockSpec((tk, tn), lambda kk: (kk, j), transforms=in_tr,
                                          delay_release=delay_release)],
            )(a_gmem, b_gmem)
            return acc_ref[...]

        acc = pl.run_scoped(accumulate, plgpu.ACC((tm, tn), jnp.float32))
        o_smem[...] = acc.astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(i * tm, tm), pl.ds(j * tn, tn)])
        plgpu.wait_smem_to_gmem(0)

    return kernel(a, b)


def matmul_mgpu_ws(a, b, *, tm=128, tn=128, tk=64, stages=4, interpret=False):
    """``a @ b`` with warp specialization: per CTA one memory warpgroup issues the TMA copies
    and two compute warpgroups each own half of a ``(2*tm, tn)`` output block, so the tensor
    cores never wait for a copy the memory warpgroup could have started earlier."""
    m, k = a.shape
    n = b.shape[1]
    dtype = a.dtype
    in_tr = _wgmma_transforms(tk, dtype)
    out_tr = _wgmma_transforms(tn, dtype)
    cta_m = 2 * tm

    def pipeline(body, context):
        return plgpu.emit_pipeline_warp_specialized(
            body, grid=(k // tk,), memory_registers=40, wg_axis="wg", num_compute_wgs=2,
            max_concurrent_steps=stages, compute_context=context,
            in_specs=[plgpu.BlockSpec((cta_m, tk), lambda kk: (0, kk), transforms=in_tr),
                      plgpu.BlockSpec((tk, tn), lambda kk: (kk, 0), transforms=in_tr)])

    def kernel(a_gmem, b_gmem, o_gmem):
        i, j = lax.axis_index("m"), lax.axis_index("n")
        rows, cols = pl.ds(i * cta_m, cta_m), pl.ds(j * tn, tn)

        def scoped(allocs, o_smem):
            wg = lax.axis_index("wg")
            half = pl.ds(wg * tm, tm)

            def context(run_pipeline):
                def with_acc(acc_ref):
                    run_pipeline(acc_ref)
                    o_smem.at[wg][...] = acc_ref[...].astype(dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(o_smem.at[wg], o_gmem.at[rows, cols].at[half])
                    plgpu.wait_smem_to_gmem(0)

                pl.run_scoped(with_acc, plgpu.ACC((tm, tn), jnp.float32))

            def step(_, a_smem, b_smem, acc_ref):
                plgpu.wgmma(acc_ref, a_smem.at[half], b_smem)
                plgpu.wgmma_wait(0)
                return acc_ref

            pipeline(step, context)(a_gmem.at[rows, :], b_gmem.at[:, cols], allocations=allocs)

        ignore = lambda *_, **__: None  # noqa: E731 - allocations do not depend on the body
        pl.run_scoped(
            scoped, pipeline(ignore, ignore).get_allocations(a_gmem.at[rows, :],
                                                             b_gmem.at[:, cols]),
            plgpu.SMEM((2, tm, tn), dtype, transforms=out_tr), collective_axes="wg")

    return plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype),
        grid=(m // cta_m, n // tn), grid_names=("m", "n"), num_threads=3, thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=gpu_interpret(interpret))(a, b)


# ---------------------------------------------------------------------------------------------
# Flash attention (forward, no mask), layout (batch, seq, heads, head_dim) as
# jax.nn.dot_product_attention takes it.


def attention_reference(q, k, v):
    """Plain JAX, float32 softmax."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s / math.sqrt(q.shape[-1]), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)


def flash_triton_kernel(q_ref, k_ref, v_ref, o_ref, *, bk, scale):
    bq, d = q_ref.shape
    q = q_ref[...]

    def step(j, carry):
        acc, m, total = carry
        kb = k_ref[pl.ds(j * bk, bk), :]
        vb = v_ref[pl.ds(j * bk, bk), :]
        s = jnp.dot(q, kb.T, preferred_element_type=jnp.float32) * (scale * LOG2E)
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        acc = acc * alpha[:, None] + jnp.dot(p.astype(vb.dtype), vb,
                                             preferred_element_type=jnp.float32)
        return acc, m_new, total * alpha + p.sum(axis=1)

    init = (jnp.zeros((bq, d), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    acc, _, total = lax.fori_loop(0, k_ref.shape[0] // bk, step, init)
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)


def flash_triton(q, k, v, *, bq=128, bk=64, num_warps=4, num_stages=2, interpret=False):
    """Program (b, h, i) owns query block i of head h and walks all key blocks in a loop,
    an online softmax carried in registers (lesson 8's algorithm, lesson 11's GPU shape)."""
    batch, seq, heads, d = q.shape
    kv_seq = k.shape[1]
    flops = 4 * batch * heads * seq * kv_seq * d
    return pl.pallas_call(
        functools.partial(flash_triton_kernel, bk=bk, scale=1 / math.sqrt(d)),
        grid=(batch, heads, seq // bq),
        in_specs=[pl.BlockSpec((None, bq, None, d), lambda b, h, i: (b, i, h, 0)),
                  pl.BlockSpec((None, kv_seq, None, d), lambda b, h, i: (b, 0, h, 0)),
                  pl.BlockSpec((None, kv_seq, None, d), lambda b, h, i: (b, 0, h, 0))],
        out_specs=pl.BlockSpec((None, bq, None, d), lambda b, h, i: (b, i, h, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        cost_estimate=pl.CostEstimate(flops=flops, transcendentals=batch * heads * seq * kv_seq,
                                      bytes_accessed=(2 * q.size + k.size + v.size)
                                      * q.itemsize),
        interpret=interpret,
    )(q, k, v)


def flash_mgpu(q, k, v, *, bq=64, bk=64, stages=2, p_in_smem=False, interpret=False):
    """One warpgroup per CTA owns ``bq`` queries of one head: Q arrives by one TMA copy and a
    barrier wait, K and V blocks stream through an ``emit_pipeline`` of ``stages`` slots, S =
    Q Kᵀ and O += P V run on WGMMA with the running max, sum and O carried in registers.

    p_in_smem: feed P to the second WGMMA from shared memory instead of registers (GPU
        interpret mode implements WGMMA operands in shared memory only)."""
    batch, seq, heads, d = q.shape
    kv_seq = k.shape[1]
    dtype = q.dtype
    tr = _wgmma_transforms(d, dtype)
    scale = LOG2E / math.sqrt(d)

    @functools.partial(
        plgpu.kernel, out_type=jax.ShapeDtypeStruct(q.shape, dtype),
        grid=(heads, seq // bq, batch), grid_names=("heads", "q", "batch"),
        scratch_types=dict(qo_smem=plgpu.SMEM((bq, d), dtype, transforms=tr),
                           p_smem=plgpu.SMEM((bq, bk), dtype,
                                             transforms=_wgmma_transforms(bk, dtype))
                           if p_in_smem else None,
                           q_barrier=plgpu.Barrier()),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=gpu_interpret(interpret))
    def kernel(q_gmem, k_gmem, v_gmem, o_gmem, qo_smem, p_smem, q_barrier):
        h, i, b = lax.axis_index("heads"), lax.axis_index("q"), lax.axis_index("batch")
        rows = pl.ds(i * bq, bq)
        plgpu.copy_gmem_to_smem(q_gmem.at[b, rows, h], qo_smem, q_barrier)
        plgpu.barrier_wait(q_barrier)

        def step(_, k_smem, v_smem, carry):
            acc, m, total = carry

            def scores(s_ref):
                plgpu.wgmma(s_ref, qo_smem, k_smem.T)
                return s_ref[...]

            s = pl.run_scoped(scores, plgpu.ACC((bq, bk), jnp.float32)) * scale
            m_new = jnp.maximum(m, s.max(axis=1))
            alpha = jnp.exp2(m - m_new)
            p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [0]))
            total = total * alpha + p.sum(axis=1)

            def weigh(pv_ref):
                if p_smem is None:
                    plgpu.wgmma(pv_ref, p.astype(dtype), v_smem)
                else:
                    p_smem[...] = p.astype(dtype)
                    plgpu.commit_smem()  # make the stores visible to the tensor cores
                    plgpu.wgmma(pv_ref, p_smem, v_smem)
                return pv_ref[...]

            pv = pl.run_scoped(weigh, plgpu.ACC((bq, d), jnp.float32))
            return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv, m_new, total

        row_layout = plgpu.Layout.WGMMA.reduce(1)
        init = (plgpu.layout_cast(jnp.zeros((bq, d), jnp.float32), plgpu.Layout.WGMMA),
                plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), row_layout),
                plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), row_layout))
        # the pipeline walks this head's key and value blocks in order
        acc, _, total = plgpu.emit_pipeline(
            step, grid=(kv_seq // bk,), max_concurrent_steps=stages, init_carry=init,
            in_specs=[plgpu.BlockSpec((None, bk, None, d), lambda j: (b, j, h, 0),
                                      transforms=tr),
                      plgpu.BlockSpec((None, bk, None, d), lambda j: (b, j, h, 0),
                                      transforms=tr)],
        )(k_gmem, v_gmem)
        qo_smem[...] = (acc / lax.broadcast_in_dim(total, acc.shape, [0])).astype(dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(qo_smem, o_gmem.at[b, rows, h])
        plgpu.wait_smem_to_gmem(0)

    return kernel(q, k, v)


# ---------------------------------------------------------------------------------------------
# Reduction: row sums


def row_sums_kernel(x_ref, o_ref, *, bn):
    def step(c, acc):
        return acc + jnp.sum(x_ref[:, pl.ds(c * bn, bn)].astype(jnp.float32), axis=1)

    o_ref[...] = lax.fori_loop(0, x_ref.shape[1] // bn, step,
                               jnp.zeros(o_ref.shape, jnp.float32)).astype(o_ref.dtype)


def row_sums_triton(x, *, bm=16, bn=1024, num_warps=4, num_stages=3, interpret=False):
    """Row sums: program i owns rows [i·bm, (i+1)·bm) and walks their columns ``bn`` at a
    time; every byte is read once, so HBM bandwidth is the ceiling."""
    m, n = x.shape
    return pl.pallas_call(
        functools.partial(row_sums_kernel, bn=bn),
        grid=(m // bm,),
        in_specs=[pl.BlockSpec((bm, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm,), lambda i: (i,)),
        out_shape=jax.ShapeDtypeStruct((m,), x.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        cost_estimate=pl.CostEstimate(flops=m * n, transcendentals=0,
                                      bytes_accessed=(m * n + m) * x.itemsize),
        interpret=interpret,
    )(x)


# ---------------------------------------------------------------------------------------------
# Grouped (ragged) matmul: rows of lhs in groups, group g multiplied by rhs[g]


def grouped_matmul_kernel(gid_ref, a_ref, b_ref, o_ref, *, bk, bn):
    g = gid_ref[pl.program_id(0)]
    cols = pl.ds(pl.program_id(1) * bn, bn)

    def step(kk, acc):
        a = a_ref[:, pl.ds(kk * bk, bk)]
        b = b_ref[g, pl.ds(kk * bk, bk), cols]
        return acc + jnp.dot(a, b, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, a_ref.shape[1] // bk, step, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


def block_groups(group_sizes, rows, bm):
    """Group of each ``bm``-row block of lhs (group sizes must be multiples of ``bm``)."""
    return jnp.searchsorted(jnp.cumsum(group_sizes), jnp.arange(rows // bm) * bm,
                            side="right").astype(jnp.int32)


def grouped_matmul_triton(lhs, rhs, group_sizes, *, bm=128, bn=128, bk=64, num_warps=4,
                          num_stages=3, interpret=False):
    """``lax.ragged_dot(lhs, rhs, group_sizes)`` for group sizes that are multiples of ``bm``:
    program (i, j) finds its row block's group in a small table and reads that group's
    ``rhs`` column band (Triton has no scalar prefetch, so the table is an ordinary input)."""
    m, k = lhs.shape
    _, _, n = rhs.shape
    gids = block_groups(group_sizes, m, bm)
    return pl.pallas_call(
        functools.partial(grouped_matmul_kernel, bk=bk, bn=bn),
        grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec(gids.shape, lambda i, j: (0,)),
                  pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec(rhs.shape, lambda i, j: (0, 0, 0))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        cost_estimate=pl.CostEstimate(flops=2 * m * n * k, transcendentals=0,
                                      bytes_accessed=(m * k + rhs.size + m * n)
                                      * lhs.itemsize),
        interpret=interpret,
    )(gids, lhs, rhs)
