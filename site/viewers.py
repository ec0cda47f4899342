"""kernelsim viewers of the site's hand-written pages: name -> Viewer.

A page under ``site/docs`` places viewer NAME with the comment ``<!-- viewer: NAME -->`` (the
standalone viewer of ``Trace.to_html``, inline) and its summary table with
``<!-- trace-summary: NAME -->``; ``site/hooks.py`` traces ``target()`` when the site is
built (index maps only: kernel bodies never run). Lessons need no entry here: their cells call
``Trace.show()``, which under the site build's nbclient is the same standalone viewer.

A target returns ``(fn, args)``, as ``kernelsim trace FILE.py:FUNC`` expects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from kernelsim import examples


@dataclass(frozen=True)
class Viewer:
    target: Callable[[], tuple[Callable, tuple]]
    title: str
    model: str = "tpu"
    chip: str | None = None
    call: int = 0


def tiled_matmul():
    keys = jax.random.split(jax.random.key(0), 2)
    x, y = (jax.random.normal(k, (512, 512), jnp.float32) for k in keys)
    return functools.partial(examples.matmul, bm=128, bk=128, bn=128), (x, y)


VIEWERS: dict[str, Viewer] = {
    "tiled-matmul": Viewer(tiled_matmul, "Tiled matmul, 512³ in 128-blocks, k innermost: the "
                           "output block is kept on chip across the k loop"),
}
