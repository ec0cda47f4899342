"""The dependent_prefetch_read rule: an output's index map that reads scalar prefetch at an
index read from scalar prefetch. Every such index map of assignment 14's kv_cache_append halted
a TPU v5e's core, 1-D table or 2-D (``chip_verdicts_v5e.KV_INDEX_MAP_RAN``); reading the table
or the positions at the step's own index ran, and so did an input's index map of the halting
form. The rule agrees with the chip on every form."""

import jax
import jax.numpy as jnp
import pytest
from chip_verdicts_v5e import INPUT_INDEX_MAP_OF_THE_HALTING_FORM_RAN, KV_INDEX_MAP_RAN
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import kernelsim
from kernelsim.cost.lint import DEPENDENT_PREFETCH_READ, rule_of

PAGE, SLOTS = 16, 4
# each form the chip ran, as an index map of (step, table, positions); the table is passed
# 2-D for the first form, flattened for the rest
INDEX_MAPS = {
    "table[s, positions[s] // 16] (2-D table)": lambda s, t, p: t[s, p[s] // PAGE],
    "table[s * 4 + positions[s] // 16] (1-D table)": lambda s, t, p: t[s * SLOTS + p[s] // PAGE],
    "table[s * 4 + (positions[s] >> 4)]":
        lambda s, t, p: t[s * SLOTS + jax.lax.shift_right_logical(p[s], 4)],
    "table[s * 4 + lax.div(positions[s], 16)]":
        lambda s, t, p: t[s * SLOTS + jax.lax.div(p[s], PAGE)],
    "table[s * 4]": lambda s, t, p: t[s * SLOTS],
    "positions[s] // 16": lambda s, t, p: p[s] // PAGE,
    "0 (a constant page)": lambda s, t, p: 0,
}


def kv_cache_append(cache, new_rows, table, positions, page_index, output_index=None):
    _, page_size, d = cache.shape
    output_index = output_index or page_index

    def kernel(table_ref, pos_ref, page_ref, new_ref, out_ref):
        row = pos_ref[pl.program_id(0)] % page_size
        rows = jax.lax.broadcasted_iota(jnp.int32, page_ref.shape, 0)
        out_ref[...] = jnp.where(rows == row, new_ref[...], page_ref[...])

    page = pl.BlockSpec((None, page_size, d), lambda s, t, p: (page_index(s, t, p), 0, 0))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(new_rows.shape[0],),
            in_specs=[page, pl.BlockSpec((None, 1, d), lambda s, *_: (s, 0, 0))],
            out_specs=pl.BlockSpec((None, page_size, d),
                                   lambda s, t, p: (output_index(s, t, p), 0, 0))),
        out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
        input_output_aliases={2: 0},
    )(table, positions, cache, new_rows)


@pytest.mark.parametrize("form", sorted(KV_INDEX_MAP_RAN))
def test_the_rule_warns_exactly_the_index_maps_that_halted_the_chip(form):
    cache = jnp.zeros((12, PAGE, 128), jnp.float32)
    new_rows = jnp.ones((3, 1, 128), jnp.float32)
    table = jnp.arange(12, dtype=jnp.int32).reshape(3, SLOTS)
    if "2-D" not in form:
        table = table.reshape(-1)
    positions = jnp.array([3, 20, 63], jnp.int32)
    call = kernelsim.trace(lambda *a: kv_cache_append(*a, INDEX_MAPS[form]), cache, new_rows,
                           table, positions).calls[0]
    found = [w for w in call.warnings if rule_of(w) == DEPENDENT_PREFETCH_READ]
    assert bool(found) == (not KV_INDEX_MAP_RAN[form]), (form, call.warnings)
    for w in found:
        assert "halted the core" in w and "before the call" in w
        assert "output 'out_ref'" in w


def test_an_input_index_map_of_the_halting_form_is_not_warned():
    """Lesson 15's paged_decode reads its K and V pages so and ran compiled on the chip."""
    table = jnp.arange(12, dtype=jnp.int32)
    call = kernelsim.trace(
        lambda *a: kv_cache_append(*a, INDEX_MAPS["table[s * 4 + positions[s] // 16] (1-D table)"],
                                   output_index=INDEX_MAPS["table[s * 4]"]),
        jnp.zeros((12, PAGE, 128), jnp.float32), jnp.ones((3, 1, 128), jnp.float32), table,
        jnp.array([3, 20, 63], jnp.int32)).calls[0]
    warned = [w for w in call.warnings if rule_of(w) == DEPENDENT_PREFETCH_READ]
    assert not warned and INPUT_INDEX_MAP_OF_THE_HALTING_FORM_RAN
