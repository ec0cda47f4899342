"""The step figure, heatmap and timeline, checked by inspecting their artists; every figure
kind readable (``unreadable_text``)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, to_hex
from views_kernels import gather_rows, matmul

import kernelsim
from kernelsim.cost.schedule import FETCH, KEEP, SKIP, WRITEBACK
from kernelsim.views import palette as pal
from kernelsim.views.figure import FONT, step_figure
from kernelsim.views.readability import drawn_texts, unreadable_text


def _artist(fig, gid):
    found = [a for a in fig.findobj() if a.get_gid() == gid]
    assert len(found) == 1, (gid, len(found))
    return found[0]


def _block(fig, name):
    rect = _artist(fig, f"block:{name}")
    return (rect.get_x(), rect.get_y(), rect.get_width(), rect.get_height()), \
        to_hex(rect.get_facecolor())


C = pal.ACTION_COLORS


@pytest.mark.parametrize("step, expected", [
    # grid (i, j, k) = (0, 0, 0): everything new; the output stays on chip.
    (0, {"x_ref": ((0, 0), "fetch"), "y_ref": ((0, 0), "fetch"), "o_ref": ((0, 0), "keep")}),
    # (0, 0, 1): x moves right along k, y down along k.
    (1, {"x_ref": ((128, 0), "fetch"), "y_ref": ((0, 128), "fetch"), "o_ref": ((0, 0), "keep")}),
    # (0, 0, 3): last k step, the output block is written back.
    (3, {"x_ref": ((384, 0), "fetch"), "y_ref": ((0, 384), "fetch"),
         "o_ref": ((0, 0), "writeback")}),
    # (1, 2, 0): row block 1 of x, column block 2 of y and the output.
    (24, {"x_ref": ((0, 128), "fetch"), "y_ref": ((256, 0), "fetch"),
          "o_ref": ((256, 128), "keep")}),
])
def test_highlighted_block_has_the_action_colour_at_the_block_position(mm_trace, step, expected):
    fig = mm_trace.figure(step)
    for name, ((x, y), action) in expected.items():
        bounds, colour = _block(fig, name)
        assert bounds == (x, y, 128, 128), name
        assert colour == C[action], (name, action)


def test_skip_is_drawn_in_the_skip_colour():
    t = kernelsim.trace(functools.partial(matmul, bk=512), jnp.ones((512, 512)),
                        jnp.ones((512, 512)))
    fig = t.figure(1)  # grid (0, 1, 0): x block (0, 0) again -> skip
    bounds, colour = _block(fig, "x_ref")
    assert bounds == (0, 0, 512, 128) and colour == C["skip"]
    assert _block(fig, "y_ref")[1] == C["fetch"]
    assert _block(fig, "o_ref")[1] == C["writeback"]


def test_header_legend_slots_scratch_and_grid_point(mm_trace):
    fig = mm_trace.figure(5)  # grid (0, 1, 1)
    texts = [t.get_text() for t in fig.texts]
    cum = int(mm_trace.calls[0].schedule.cumulative_bytes[5])
    # steps count from 0, as in Trace.steps() and the tables
    assert any(t.startswith("step 5 of 0–63") and "grid index (0, 1, 1)" in t for t in texts)
    assert any(f"{cum:,}" in t for t in texts)
    legend = fig.legends[0]
    assert [to_hex(h.get_facecolor()) for h in legend.legend_handles] == list(C.values())
    # x: fetched at steps 0..5 -> 6 fetches -> the kernel reads slot 1; step 6 fetches again,
    # so slot 0 is being filled. Labels sit on white or a light tint, never on a hatch.
    slot0, slot1 = _artist(fig, "slot:x_ref:0"), _artist(fig, "slot:x_ref:1")
    assert slot1.get_linewidth() > slot0.get_linewidth()
    assert slot0.get_hatch() in ("", None) and slot1.get_hatch() in ("", None)
    labels = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert "1: kernel reads" in labels and "0: filling (next)" in labels
    assert _artist(fig, "scratch:acc_ref") is not None
    marker = _artist(fig, "gridpoint")
    assert marker.get_xy() == (1, 1)  # last two grid axes: (j, k) = (1, 1)


def test_rank3_rank1_operands_and_smem_reads(gather_trace):
    fig = gather_trace.figure(5)  # grid (1, 1): idx[1] = 1 -> x row block 1
    assert _block(fig, "x_ref")[0] == (0, 8, 128, 8)
    assert _block(fig, "b_ref")[0] == (0, 0, 128, 1)  # rank 1: one row
    bounds, _ = _block(fig, "o_ref")  # rank 3: last two dims, leading index labelled
    assert bounds == (0, 8, 128, 8)
    assert any("[1, :, :]" in t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    hot = [i for i in range(4)
           if to_hex(_artist(fig, f"smem:idx_ref:{i}").get_facecolor()) == pal.SMEM_READ]
    assert hot == [1]


def test_schedule_views_numbers(mm_trace):
    s = mm_trace.calls[0].schedule
    assert s.cumulative_bytes[-1] == mm_trace.calls[0].cost.hbm_bytes
    x = s.operand_schedule("x_ref")
    assert x.slots[:4].tolist() == [0, 1, 0, 1]
    counts = x.transfer_counts()
    assert counts.shape == (4, 4) and (counts == 4).all()  # every x block fetched 4 times (j)
    o = s.operand_schedule("o_ref")
    assert (o.transfer_counts() == 1).all()
    assert set(np.unique(o.actions)) == {KEEP, WRITEBACK} and FETCH != SKIP


def test_heatmap_counts_and_timeline(mm_trace):
    fig = mm_trace.heatmap()
    im = _artist(fig, "heatmap:x_ref")
    assert (np.asarray(im.get_array()) == 4).all()
    assert _artist(fig, "count:x_ref:0:0").get_text() == "4"
    assert not [a for a in mm_trace.heatmap(counts=False).findobj()
                if str(a.get_gid()).startswith("count:")]
    fig = mm_trace.timeline()
    line = _artist(fig, "cumulative")
    np.testing.assert_array_equal(line.get_ydata(), mm_trace.calls[0].schedule.cumulative_bytes)
    bar = _artist(fig, "roofline:memory")
    assert bar.get_width() == pytest.approx(mm_trace.calls[0].cost.memory_seconds)
    FigureCanvasAgg(fig).draw()


def test_gpu_model_view_rebuilds_schedule_from_the_call(mm_trace):
    fig = step_figure(mm_trace, 1, model="gpu")
    assert _block(fig, "o_ref")[1] == C["writeback"]  # gpu: every program stores its block


def test_compare_table_and_figure(mm_trace):
    t2 = kernelsim.trace(functools.partial(matmul, bm=256, bn=256), jnp.ones((512, 512)),
                         jnp.ones((512, 512)))
    cmp = kernelsim.compare(mm_trace, t2, labels=["128 blocks", "256 blocks"])
    text = str(cmp)
    assert "128 blocks" in text and "256 blocks" in text
    assert f"{mm_trace.calls[0].cost.hbm_bytes:,}" in text
    assert f"{t2.calls[0].cost.hbm_bytes:,}" in text
    fig = cmp.figure()
    lines = {a.get_label(): a for a in fig.findobj() if a.get_gid() == "compare:cumulative"}
    assert set(lines) == {"128 blocks", "256 blocks"}
    assert lines["256 blocks"].get_ydata()[-1] == t2.calls[0].cost.hbm_bytes
    FigureCanvasAgg(fig).draw()


def test_step_out_of_range(mm_trace):
    with pytest.raises(IndexError, match="64 steps"):
        mm_trace.figure(64)


def seven_operands(*xs):
    """Six inputs and one output, for a crowded step figure."""
    def kernel(*refs):
        refs[-1][...] = sum(r[...] for r in refs[:-1])

    spec = pl.BlockSpec((128, 128), lambda i, j: (i, j))
    return pl.pallas_call(kernel, grid=(2, 2), in_specs=[spec] * len(xs), out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(xs[0].shape, xs[0].dtype))(*xs)


def _figures(mm_trace, gather_trace):
    x = jnp.ones((256, 256))
    crowded = kernelsim.trace(seven_operands, *[x] * 6)
    return {
        "matmul step": mm_trace.figure(5), "gather step": gather_trace.figure(5),
        "seven operands step": crowded.figure(3), "matmul heatmap": mm_trace.heatmap(),
        "gather heatmap": gather_trace.heatmap(), "seven operands heatmap": crowded.heatmap(),
        "timeline": mm_trace.timeline(),
        "compare": kernelsim.compare(mm_trace, crowded, labels=["matmul", "sum"]).figure(),
        # a last estimate half the longest, and long labels: a legend in the lower right
        # covered that bar's label
        "compare, half last": kernelsim.compare(
            mm_trace, mm_trace, kernelsim.trace(matmul, jnp.ones((256, 512)), jnp.ones((512, 512))),
            labels=["lesson 8", "JAX op, bk_major 128", "JAX op, bk_major 512"]).figure(),
        "access": kernelsim.trace(gather_rows, jnp.array([3, 1, 1, 0], jnp.int32),
                                  jnp.zeros((32, 128)), record_access=True)
        .access_figure(2, "o_ref"),
        "gpu model step": step_figure(mm_trace, 3, model="gpu"),
    }


def test_every_figure_is_readable_and_no_text_is_small(mm_trace, gather_trace):
    for name, fig in _figures(mm_trace, gather_trace).items():
        assert unreadable_text(fig) == [], name
        assert [t.get_text() for t, _ in drawn_texts(fig) if t.get_fontsize() < FONT] == [], name


def test_counts_get_integer_ticks_and_a_discrete_scale(gather_trace):
    fig = gather_trace.heatmap()
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        for label in ax.get_xticklabels() + ax.get_yticklabels():
            text = label.get_text().replace("−", "-")
            assert not text or float(text).is_integer(), (ax.get_title(), text)
    im = _artist(fig, "heatmap:b_ref")  # rank 1: a single row of blocks
    assert im.get_array().shape[0] == 1
    assert isinstance(im.norm, BoundaryNorm) and im.cmap.N == len(im.norm.boundaries) - 1


def test_bytes_axes_are_labelled_in_units_without_an_offset(mm_trace):
    """Lesson 4's comparison read "1e6" at the top of its bytes axis (issue 50): every bytes
    axis labels its ticks in one unit (``2 MB``) and leaves matplotlib's offset text empty."""
    t2 = kernelsim.trace(functools.partial(matmul, bm=256, bk=256, bn=256),
                         jnp.ones((512, 512), jnp.float32), jnp.ones((512, 512), jnp.float32))
    figures = {"compare": kernelsim.compare(mm_trace, t2).figure(),
               "timeline": mm_trace.timeline()}
    for name, fig in figures.items():
        FigureCanvasAgg(fig).draw()
        for ax in fig.axes:
            if "bytes" not in ax.get_ylabel():
                continue
            assert ax.yaxis.get_offset_text().get_text() == "", (name, ax.get_ylabel())
            labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text() not in ("", "0")]
            units = {label.split()[-1] for label in labels}
            assert len(units) == 1 and units <= {"B", "kB", "MB", "GB"}, (name, labels)
