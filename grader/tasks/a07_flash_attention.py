"""Assignment 07, flash attention: its tasks, cases and structural rules.

The backward task (``flash_attention_backward``) returns ``(dq, dk, dv)``; ``calling.rows_stacked``
stacks their rows into the one array judged, against ``jax.vjp`` of plain-JAX attention. Its
inputs hold the forward's output ``o`` and logsumexp ``lse`` computed in plain JAX from the
case's ``q``, ``k`` and ``v`` (``_backward_inputs``), so every input is one of the function's
arguments and the shared work rules apply unchanged. Its structure follows FlashAttention-2's
backward as JAX's TPU op has it (``jax/experimental/pallas/ops/tpu/flash_attention.py``: ``di``
first, then a ``dK``/``dV`` kernel with the key axis outer and a ``dq`` kernel with it inner).
``attention_with_grad`` puts a forward that saves ``lse`` and that backward behind
``jax.custom_vjp``; ``calling.vjp_rows_stacked`` differentiates it with ``jax.vjp``, as
assignment 10's ``rms_norm`` (whose module says why not ``jax.grad``), and the same rules
find the backward's kernels in that program, beside the forward's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from grader import calling
from grader.tasks.core import (
    TOLERANCES,
    Case,
    Rule,
    as_f32,
    block_is,
    cdiv,
    dtype_of,
    grid_is,
    make_case,
    nbytes_of,
    normal_array,
    operands_with_role,
    read_budget,
    register_task,
    single_call,
    total_budget,
)

A7 = "07_flash_attention"


def _scores_ref(q, k, bq, bk):
    d = q.shape[-1]
    s = jnp.dot(q, k.T, precision="highest", preferred_element_type=jnp.float32)
    return (s / math.sqrt(d)).astype(q.dtype)


def _attn_ref(q, k, v, bq, bk, causal=False):
    s = jnp.dot(q, k.T, precision="highest",
                preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape
        s = jnp.where(jnp.arange(lq)[:, None] >= jnp.arange(lk)[None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.dot(p, as_f32(v), precision="highest").astype(q.dtype)


def _scores_rules(call, case, rules, inputs):
    (lq, _), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(lq, bq), cdiv(lk, bk))))
    rules.append(block_is(call, "output", 0, (bq, bk), "scores"))


def _flash_rules(call, case, rules, inputs, causal=False):
    (lq, d), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    rules.append(grid_is(call, (cdiv(lq, bq), lk // bk)))
    rules.extend(total_budget(call, None, nbytes_of((lq, d), case.dtype)))
    if causal:
        needed = sum(min(lk // bk, cdiv(min(lq, (i + 1) * bq), bk)) for i in range(cdiv(lq, bq)))
        budget = needed * nbytes_of((bk, d), case.dtype)
        label = f"k (only the {needed} blocks at or below the diagonal)"
    else:
        budget = cdiv(lq, bq) * nbytes_of((lk, d), case.dtype)
        label = f"k (once per query block, {cdiv(lq, bq)} times)"
    rules.append(read_budget(call, "input", 1, budget, label))
    rules.append(Rule("no (Lq, Lk) scores in HBM",
                      f"writes <= {nbytes_of((lq, d), case.dtype):,} B",
                      f"{call.hbm_write_bytes:,} B",
                      call.hbm_write_bytes <= nbytes_of((lq, d), case.dtype)))
    rules.append(_lane_statistics_rule(call, bq))


STATISTICS_LANES = 128  # a vector register's lanes: the width of lesson 8's running max and sum


def _lane_statistics_rule(call, bq: int) -> Rule:
    """Lesson 8's fast form: the running max and sum as two (bq, 128) float32 scratch rows,
    not (bq, 1) columns, which are spread across the lanes at every step."""
    scratch = [tuple(o.shape) for o in operands_with_role(call, "scratch")]
    rows = scratch.count((bq, STATISTICS_LANES))
    return Rule("running max and sum as (bq, 128) rows",
                f"two ({bq}, {STATISTICS_LANES}) float32 scratch buffers, each row's value in "
                "every lane (lesson 8: a (bq, 1) column is spread across the lanes at every "
                "step)", f"scratch {scratch}", rows >= 2)


_qkv = lambda lq, lk, d: {"q": (lq, d), "k": (lk, d), "v": (lk, d)}  # noqa: E731
LOGIT_SCALE = 6  # "large" cases: q and k are 6 N(0, 1), so scores are 36 N(0, 1) (see below)


def _attention_inputs(rng: np.random.Generator, case: Case) -> dict[str, np.ndarray]:
    """q, k, v drawn N(0, 1), or for a "large" case q and k scaled by ``LOGIT_SCALE``: a score
    q.k / sqrt(d) is then 36 N(0, 1), so most query rows have one above 88.7, where float32 exp
    overflows unless the row's max is subtracted first. The scores stay below a few hundred,
    where a float32 rounding is ~1e-5: the reference and any correct order of summation agree
    within the tolerance. (Inputs of 30 N(0, 1) + 60 made scores of ~3e4, whose rounding alone
    moved a near-tied softmax, and the output, by up to 0.2.) v stays N(0, 1)."""
    scale = {"q": LOGIT_SCALE, "k": LOGIT_SCALE} if case.values == "large" else {}
    return {name: np.asarray((normal_array(rng, shape, "float32") * scale.get(name, 1))
                             .astype(dtype_of(case.dtype)))
            for name, shape in case.arrays.items()}


register_task(
    id="attention_scores", assignment=A7, title="Tiled scaled scores q @ k.T / sqrt(d)",
    kernel_ops=(("dot_general",),),
    reference=_scores_ref, tolerance="reduction",
    cases=(
        # score blocks (bq, bk) are the output's: bk a multiple of 128 (the TPU's lane rule),
        # every block a power of two (Triton's), so the kernel compiles on both
        make_case("v0", 18, "float32", {"q": (32, 64), "k": (256, 64)}, bq=16, bk=128),
        make_case("h0", 281, "float32", {"q": (40, 64), "k": (300, 64)}, True, bq=16, bk=128),
        make_case("h1", 282, "bfloat16", {"q": (64, 128), "k": (256, 128)}, True, bq=32, bk=128),
        make_case("h2", 283, "float32", {"q": (48, 32), "k": (384, 32)}, True, bq=16, bk=128),
    ),
    structure=single_call(_scores_rules),
)
register_task(
    id="flash_attention", assignment=A7, title="Flash-attention forward (online softmax)",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=_attn_ref, tolerance="attention", make=_attention_inputs,
    cases=(
        make_case("v0", 19, "float32", _qkv(32, 128, 64), bq=16, bk=32),
        # large scores, visible: the online softmax overflows without the running max
        make_case("v1", 21, "float32", _qkv(32, 128, 64), values="large", bq=16, bk=32),
        make_case("h0", 291, "float32", _qkv(40, 128, 64), True, bq=16, bk=32),
        make_case("h1", 292, "bfloat16", _qkv(64, 128, 128), True, bq=32, bk=64),
        make_case("h2", 293, "float32", _qkv(16, 48, 32), True, bq=8, bk=16),
        make_case("h3", 294, "float32", _qkv(32, 128, 64), True, values="large", bq=16, bk=32),
    ),
    structure=single_call(_flash_rules),
)
register_task(
    id="causal_flash_attention", assignment=A7, title="Causal flash attention, skipping blocks",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=lambda q, k, v, bq, bk: _attn_ref(q, k, v, bq, bk, causal=True),
    tolerance="attention", make=_attention_inputs,
    cases=(
        make_case("v0", 20, "float32", _qkv(64, 64, 64), bq=16, bk=16),
        make_case("v1", 22, "float32", _qkv(64, 64, 64), values="large", bq=16, bk=16),
        make_case("h0", 301, "float32", _qkv(96, 96, 64), True, bq=32, bk=16),
        make_case("h1", 302, "bfloat16", _qkv(128, 128, 128), True, bq=32, bk=32),
        make_case("h2", 303, "float32", _qkv(48, 48, 32), True, bq=16, bk=16),
        make_case("h3", 304, "float32", _qkv(64, 64, 64), True, values="large", bq=16, bk=16),
        # bq < bk: every query block ends inside a key block that straddles the diagonal
        make_case("h4", 305, "float32", _qkv(128, 128, 64), True, bq=16, bk=32),
    ),
    structure=single_call(lambda call, case, rules, inputs: _flash_rules(call, case, rules, inputs,
                                                                   causal=True)),
)


# ----------------------------------------------------------------------------- the backward
def _backward_ref(q, k, v, o, lse, do, bq, bk):
    """The rows of plain JAX's ``dq``, ``dk`` and ``dv`` for the cotangent ``do``, stacked
    ``(Lq + 2 Lk, d)``: ``jax.vjp`` of the attention at ``q``, ``k``, ``v`` (``o`` and ``lse``,
    the forward's residuals, are the learner's to use)."""
    _, pullback = jax.vjp(lambda q, k, v: _attn_ref(q, k, v, bq, bk), q, k, v)
    return jnp.concatenate(pullback(do))


def _backward_inputs(rng: np.random.Generator, case: Case) -> dict[str, np.ndarray]:
    """``q``, ``k``, ``v`` and ``do`` drawn as ``_attention_inputs`` draws them; ``o`` and
    ``lse`` (the logsumexp of each query row's scaled scores, ``(Lq, 1)``) the forward's, in
    float32 at HIGHEST precision."""
    drawn = _attention_inputs(rng, case)
    q, k, v = (jnp.asarray(drawn[name]) for name in ("q", "k", "v"))
    s = jnp.dot(q, k.T, precision="highest") / math.sqrt(q.shape[-1])
    return {"q": drawn["q"], "k": drawn["k"], "v": drawn["v"],
            "o": np.asarray(_attn_ref(q, k, v, None, None)),
            "lse": np.asarray(jax.nn.logsumexp(s, axis=1, keepdims=True)), "do": drawn["do"]}


def _backward_rules(t, case: Case, inputs: dict, forward: bool = False) -> list[Rule]:
    """Task 4's kernels: ``D``, a ``dk``/``dv`` kernel and a ``dq`` kernel, with no (Lq, Lk)
    array written. ``forward``: task 5's program, which also runs the forward kernel that
    saves ``lse``."""
    (lq, d), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    query_blocks, key_blocks = lq // bq, lk // bk
    item = np.dtype(dtype_of(case.dtype)).itemsize
    row = 4  # one float32 per query row: lse and D
    written = (lq + 2 * lk) * d * item + lq * row + (lq * d * item + lq * row) * forward
    what = "o and lse, D, dq, dk and dv" if forward else "D, dq, dk and dv"
    writes = sum(c.hbm_write_bytes for c in t.calls)
    rules = [Rule("no (Lq, Lk) array in HBM (the scores and probabilities stay in VMEM)",
                  f"all kernels write <= {written:,} B ({what})", f"{writes:,} B",
                  writes <= written)]
    outputs = [[o.shape for o in operands_with_role(c, "output")] for c in t.calls]

    def writing(shapes):
        return next((c for c, s in zip(t.calls, outputs, strict=True) if s == shapes), None)

    if forward:
        fwd = writing([(lq, d), (lq, 1)])
        rules.append(Rule("a forward kernel saving lse", "one pallas_call writing o, (Lq, d), "
                          "and lse, (Lq, 1)", str(outputs), fwd is not None))
        if fwd is not None:
            rules.append(Rule("forward grid", str((cdiv(lq, bq), lk // bk)),
                              str(tuple(fwd.grid)), tuple(fwd.grid) == (cdiv(lq, bq), lk // bk)))
    dkv, dq = writing([(lk, d), (lk, d)]), writing([(lq, d)])
    rules.append(Rule("a dk/dv kernel", "one pallas_call writing dk and dv, each (Lk, d)",
                      str(outputs), dkv is not None))
    rules.append(Rule("a dq kernel", "one pallas_call writing dq, (Lq, d)", str(outputs),
                      dq is not None))
    if dkv is not None:
        grid = (key_blocks, query_blocks)
        rules.append(Rule("dk/dv grid (key blocks outer, query blocks inner)", str(grid),
                          str(tuple(dkv.grid)), tuple(dkv.grid) == grid))
        # k and v once; q, do, lse and D once per key block
        budget = 2 * lk * d * item + key_blocks * (2 * lq * d * item + 2 * lq * row)
        rules.extend(total_budget(dkv, budget, None))
    if dq is not None:
        grid = (query_blocks, key_blocks)
        rules.append(Rule("dq grid (query blocks outer, key blocks inner)", str(grid),
                          str(tuple(dq.grid)), tuple(dq.grid) == grid))
        # q, do, lse and D once; k and v once per query block
        budget = 2 * lq * d * item + 2 * lq * row + query_blocks * 2 * lk * d * item
        rules.extend(total_budget(dq, budget, None))
    return rules


def _backward_arrays(lq, lk, d):
    return {**_qkv(lq, lk, d), "o": (lq, d), "lse": (lq, 1), "do": (lq, d)}


register_task(
    id="flash_attention_backward", assignment=A7,
    title="Flash-attention backward: D, a dk/dv kernel and a dq kernel",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=_backward_ref, invoke=calling.rows_stacked, make=_backward_inputs,
    tolerance="attention_backward",
    cases=(
        make_case("v0", 23, "float32", _backward_arrays(256, 256, 128), bq=128, bk=128),
        # fewer queries than keys: dq's rows and dk's differ in number
        make_case("h0", 311, "float32", _backward_arrays(128, 256, 128), True, bq=128, bk=128),
        # large scores: exp(s) overflows unless lse is subtracted inside the exponent
        make_case("h1", 312, "float32", _backward_arrays(256, 256, 128), True, values="large",
                  bq=128, bk=128),
        # bq != bk: a transpose that only matches square blocks fails here
        make_case("h2", 313, "float32", _backward_arrays(256, 256, 128), True, bq=128, bk=256),
    ),
    structure=_backward_rules,
)


def _with_grad_ref(q, k, v, do, bq, bk):
    """The rows of the attention's output and plain JAX's ``dq``, ``dk`` and ``dv`` for the
    cotangent ``do``, stacked ``(2 Lq + 2 Lk, d)``."""
    o, pullback = jax.vjp(lambda q, k, v: _attn_ref(q, k, v, bq, bk), q, k, v)
    return jnp.concatenate([o, *pullback(do)])


register_task(
    id="attention_with_grad", assignment=A7,
    title="Forward and backward kernels behind jax.custom_vjp, differentiated by jax.vjp",
    kernel_ops=(("dot_general",), ("exp",), ("log",)),
    reference=_with_grad_ref, invoke=calling.vjp_rows_stacked, make=_attention_inputs,
    tolerance="attention_backward",
    cases=(
        make_case("v0", 24, "float32", {**_qkv(256, 256, 128), "do": (256, 128)}, bq=128,
                  bk=128),
        make_case("h0", 321, "float32", {**_qkv(128, 256, 128), "do": (128, 128)}, True,
                  bq=128, bk=128),
    ),
    structure=lambda t, case, inputs: _backward_rules(t, case, inputs, forward=True),
)


# ----------------------------------------------------------------------------- dropout (lesson 8)
KEEP_SIGMAS = 5  # the kept fraction may stray this many binomial standard deviations from 1 - rate


def _dropout_inputs(rng: np.random.Generator, case: Case) -> dict[str, np.ndarray]:
    """q, k, v as ``_attention_inputs`` draws them, and two seeds for the dropout, each a (1,)
    int32 array (one compiled kernel serves every seed): the case's, and the next, which
    ``calling.dropout_draws`` draws a second mask with."""
    qkv = {n: s for n, s in case.arrays.items() if n not in ("seed", "other_seed")}
    drawn = _attention_inputs(rng, Case(case.name, case.seed, case.dtype, qkv, case.params,
                                        case.hidden, case.values))
    return {**drawn, "seed": np.array([case.seed], np.int32),
            "other_seed": np.array([case.seed + 1], np.int32)}


def _dropout_layout(q, k, v, seed, other_seed, bq, bk, rate):
    """What ``calling.dropout_draws`` hands back, with nothing dropped: the attention output and
    two masks of ones, flattened into one float32 vector. Only its shape and dtype are read: the
    task's output rules judge the learner's own mask (``_dropout_output_rules``)."""
    ones = jnp.ones(q.shape[0] * k.shape[0], jnp.float32)
    return jnp.concatenate([jnp.ravel(_attn_ref(q, k, v, bq, bk)).astype(jnp.float32), ones,
                            ones])


def _dropped_attention(q, k, v, keep, rate) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) with each probability times keep / (1 - rate), then times v, in
    float64: dropout on the attention probabilities, after the softmax over every key."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.T / math.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (p * keep / (1 - rate)) @ v


def _dropout_output_rules(case: Case, inputs: dict, output: np.ndarray) -> list[Rule]:
    """What a right dropout shows, its mask being its own random draw: the mask holds 0 and 1,
    keeps about 1 - rate of the entries, every (bq, bk) block draws its own bits, the next
    seed draws another mask, and the output is the attention with that very mask."""
    (lq, d), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk, rate = case.params["bq"], case.params["bk"], case.params["rate"]
    got = np.asarray(output, np.float64).ravel()
    if got.size != lq * d + 2 * lq * lk:
        return [Rule("output and keep mask", f"an output ({lq}, {d}) and a keep mask "
                     f"({lq}, {lk})", f"{got.size:,} values in all (after "
                     f"{lq * d + lq * lk:,} for the output and the mask, the grader adds "
                     f"{lq * lk:,} of the other seed's mask)", False)]
    out = got[:lq * d].reshape(lq, d)
    keep, keep_next = got[lq * d:].reshape(2, lq, lk)
    binary = bool(np.isin(keep, (0, 1)).all() and np.isin(keep_next, (0, 1)).all())
    rules = [Rule("keep mask holds 0 or 1", "1 where the probability is kept, 0 where dropped",
                  "it does" if binary else f"values {np.unique(keep)[:4]}", binary)]
    kept = float(keep.mean())
    tolerance = KEEP_SIGMAS * math.sqrt(rate * (1 - rate) / keep.size)
    rules.append(Rule("kept fraction", f"1 - rate = {1 - rate:.3f} within {tolerance:.3f} "
                      f"({KEEP_SIGMAS} standard deviations of {keep.size:,} draws)",
                      f"{kept:.3f}", abs(kept - (1 - rate)) <= tolerance))
    blocks = keep.reshape(lq // bq, bq, lk // bk, bk).transpose(0, 2, 1, 3).reshape(-1, bq * bk)
    repeated = len(blocks) - len(np.unique(blocks, axis=0))
    rules.append(Rule("every (bq, bk) block draws its own bits", "no two blocks of the keep "
                      "mask alike: fold the grid step's block indices into the key",
                      f"{repeated} of {len(blocks)} blocks repeat another" if repeated
                      else "they do", not repeated))
    differ, independent = float((keep != keep_next).mean()), 2 * rate * (1 - rate)
    rules.append(Rule("the seed decides the bits", f"seed + 1 draws another mask: at least "
                      f"{independent / 2:.0%} of its entries differ (two independent masks "
                      f"differ in {independent:.0%})", f"{differ:.1%} differ",
                      differ >= independent / 2))
    expected = _dropped_attention(inputs["q"], inputs["k"], inputs["v"], keep, rate)
    rtol, atol = TOLERANCES["attention"][case.dtype]
    off = np.abs(out - expected) - (atol + rtol * np.abs(expected))
    worst = np.unravel_index(int(np.argmax(off)), off.shape)
    rules.append(Rule("output = attention with your keep mask", "softmax(q k^T / sqrt(d)) "
                      "(over every key, dropped or not), times keep / (1 - rate), times v",
                      "it is" if (off <= 0).all() else
                      f"off by {abs(out - expected)[worst]:.3g} at {tuple(map(int, worst))}",
                      bool((off <= 0).all())))
    return rules


def _dropout_structure(t, case: Case, inputs: dict) -> list[Rule]:
    """Two calls (the case's seed and the other): each the flash attention's grid and reads,
    writing only the output and the keep mask."""
    (lq, d), (lk, _) = case.arrays["q"], case.arrays["k"]
    bq, bk = case.params["bq"], case.params["bk"]
    rules = [Rule("pallas_calls reached", "exactly 2 (one per seed; your function makes one)",
                  str(len(t.calls)), len(t.calls) == 2)]
    written = nbytes_of((lq, d), case.dtype) + lq * lk * 4
    for call in t.calls[:2]:
        rules.append(grid_is(call, (lq // bq, lk // bk)))
        # k: the first input of its shape (the seed may come before it, in SMEM or prefetched)
        k_at = next((n for n, o in enumerate(operands_with_role(call, "input"))
                     if tuple(o.shape) == (lk, d)), 0)
        rules.append(read_budget(call, "input", k_at,
                                 (lq // bq) * nbytes_of((lk, d), case.dtype),
                                 f"k (once per query block, {lq // bq} times)"))
        rules.append(Rule("no (Lq, Lk) scores in HBM", f"writes <= {written:,} B (the output "
                          "and the int32 keep mask)", f"{call.hbm_write_bytes:,} B",
                          call.hbm_write_bytes <= written))
    return rules


def _dropout_case(lq: int, lk: int, d: int) -> dict[str, tuple[int, ...]]:
    return {**_qkv(lq, lk, d), "seed": (1,), "other_seed": (1,)}


register_task(
    id="dropout_attention", assignment=A7,
    title="Flash attention with dropout drawn inside the kernel",
    kernel_ops=(("dot_general",), ("exp",)),
    reference=_dropout_layout, tolerance="attention", make=_dropout_inputs,
    invoke=calling.dropout_draws, output_rules=_dropout_output_rules,
    cases=(
        # the keep mask's (bq, bk) blocks are an output's: bk a multiple of 128 (the lane rule)
        make_case("v0", 31, "float32", _dropout_case(32, 256, 64), bq=16, bk=128, rate=0.25),
        make_case("h0", 311, "bfloat16", _dropout_case(64, 256, 128), True, bq=32, bk=128,
                  rate=0.1),
        make_case("h1", 312, "float32", _dropout_case(16, 384, 32), True, bq=8, bk=128,
                  rate=0.5),
        make_case("h2", 313, "float32", _dropout_case(32, 256, 64), True, values="large", bq=16,
                  bk=128, rate=0.2),
    ),
    structure=_dropout_structure,
)
