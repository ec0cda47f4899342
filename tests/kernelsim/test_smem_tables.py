"""The smem_2d_table rule: a 2-D scalar-prefetch table read by an index map.

Assignment 14's kv_cache_append with a 2-D page table in its index map halted a TPU v5e's
core (``chip_verdicts_v5e.TWO_D_PAGE_TABLE_IN_INDEX_MAP_HALTED``); the flattened table works.
"""

import jax
import jax.numpy as jnp
import pytest
from chip_verdicts_v5e import TWO_D_PAGE_TABLE_IN_INDEX_MAP_HALTED
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.lint import SMEM_2D_TABLE, rule_of

PAGE = 16


def kv_cache_append(cache, new_rows, page_indices, positions, flat):
    """A14's append; ``flat``: the page table passed as page_indices.reshape(-1)."""
    _, page_size, d = cache.shape
    slots = page_indices.shape[1]

    def kernel(table_ref, pos_ref, page_ref, new_ref, out_ref):
        row = pos_ref[pl.program_id(0)] % page_size
        rows = jax.lax.broadcasted_iota(jnp.int32, page_ref.shape, 0)
        out_ref[...] = jnp.where(rows == row, new_ref[...], page_ref[...])

    def page_of(s, table_ref, pos_ref):
        if flat:
            return (table_ref[s * slots + pos_ref[s] // page_size], 0, 0)
        return (table_ref[s, pos_ref[s] // page_size], 0, 0)

    page = pl.BlockSpec((None, page_size, d), page_of)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(new_rows.shape[0],),
            in_specs=[page, pl.BlockSpec((None, 1, d), lambda s, *_: (s, 0, 0))],
            out_specs=page),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={2: 0},
    )(page_indices.reshape(-1) if flat else page_indices, positions, cache, new_rows)


def _args():
    cache = jnp.zeros((12, PAGE, 128), jnp.float32)
    new_rows = jnp.ones((3, 1, 128), jnp.float32)
    page_indices = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
    positions = jnp.array([3, 20, 63], jnp.int32)
    return cache, new_rows, page_indices, positions


@pytest.mark.parametrize("flat", [False, True])
def test_a_2d_page_table_in_an_index_map_is_found_and_the_flat_one_is_not(flat):
    call = kernelsim.trace(lambda *a: kv_cache_append(*a, flat=flat), *_args()).calls[0]
    found = [w for w in call.warnings if rule_of(w) == SMEM_2D_TABLE]
    assert bool(found) == (TWO_D_PAGE_TABLE_IN_INDEX_MAP_HALTED and not flat)
    if found:
        (w,) = found
        assert "'table_ref' of shape (3, 4)" in w and "read by an index map" in w
        assert ".reshape(-1)" in w and "t[i * 4 + j]" in w
        assert "2,048 B of SMEM, not 48 B" in w  # (3, 4) int32 tiled as (4, 128) words
