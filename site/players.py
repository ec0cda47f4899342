"""The kernelsim step players of the site: name -> Player.

``site/hooks.py`` traces each ``target()`` with ``kernelsim.trace`` (index maps only: kernel
bodies never run), writes ``Trace.to_html`` to ``build/site/players/NAME.html`` and embeds it
in lesson ``lesson`` right after the notebook cell that holds heading ``after`` (an anchor id
of the rendered page; the end of the page when absent or not found). A lesson's markdown cell
can also place one itself with the comment ``<!-- player: NAME -->``; a page under
``site/docs`` can too.

A target returns ``(fn, args)``, as ``kernelsim trace FILE.py:FUNC`` expects. Shapes are kept
small so that every step is shown (a player samples the steps above about 1 MB of data).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernelsim import examples


@dataclass(frozen=True)
class Player:
    target: Callable[[], tuple[Callable, tuple]]
    title: str
    lesson: str | None = None   # lesson file stem, e.g. "03-tiling"
    after: str | None = None    # heading anchor in that lesson's page
    model: str = "tpu"
    chip: str | None = None
    call: int = 0


def _arrays(*shapes, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), len(shapes))
    return tuple(jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes, strict=True))


def tiled_add():
    return functools.partial(examples.add, block=(128, 128)), _arrays((512, 512), (512, 512))


def tiled_matmul():
    return (functools.partial(examples.matmul, bm=128, bk=128, bn=128),
            _arrays((512, 512), (512, 512)))


def transpose():
    return functools.partial(examples.transpose, block=128), _arrays((512, 384))


def block_sparse():
    return examples.block_sparse_target()


def _schedule_only(q_ref, k_ref, v_ref, o_ref):
    # The player shows which blocks move; kernelsim.trace never runs a kernel body.
    o_ref[...] = jnp.zeros_like(o_ref)


def attention_blocks():
    """The grid of a flash-attention kernel: query blocks outside, key/value blocks inside."""
    n, d, bq, bk = 512, 64, 128, 128

    def fn(q, k, v):
        return pl.pallas_call(
            _schedule_only,
            grid=(n // bq, n // bk),
            in_specs=[pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
                      pl.BlockSpec((bk, d), lambda i, j: (j, 0)),
                      pl.BlockSpec((bk, d), lambda i, j: (j, 0))],
            out_specs=pl.BlockSpec((bq, d), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((n, d), jnp.float32),
        )(q, k, v)

    return fn, _arrays((n, d), (n, d), (n, d))


PLAYERS: dict[str, Player] = {
    "tiled-add": Player(tiled_add, "Tiled add, 512 × 512 in 128 × 128 blocks: every block is "
                        "fetched once and written back once", "03-tiling",
                        "which-bytes-are-on-chip"),
    "tiled-matmul": Player(tiled_matmul, "Tiled matmul, 512³ in 128-blocks, k innermost: the "
                           "output block is kept on chip across the k loop", "03-tiling",
                           "a-tiled-matmul"),
    "transpose": Player(transpose, "Transpose through the index map: output block (i, j) "
                        "reads input block (j, i)", "04-index-maps",
                        "transpose-through-the-map"),
    "matmul-accumulator": Player(tiled_matmul, "The same matmul with its VMEM accumulator: "
                                 "writebacks only at the last k step", "05-memory-spaces",
                                 "scratch-state-that-outlives-a-grid-step"),
    "block-sparse": Player(block_sparse, "Block-sparse matmul: scalar prefetch picks which "
                           "blocks of x each step fetches", "06-scalar-prefetch",
                           "block-sparse-matmul"),
    "attention-blocks": Player(attention_blocks, "A flash-attention grid: the query block "
                               "stays while key and value blocks stream past",
                               "08-flash-attention",
                               "kernel-1-the-keyvalue-loop-as-an-arbitrary-grid-axis"),
}
