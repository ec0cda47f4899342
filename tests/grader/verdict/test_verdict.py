"""The trusted side of grading without nbgrader: verdicts, facts, the test cells' checks."""

from __future__ import annotations

import json

import jax.numpy as jnp
import nbformat
import numpy as np
import pytest

from grader.jail import trusted
from grader.logistics.submission import test_cell_changes as cell_changes
from grader.verdict import refs, verdict
from kernelsim import examples
from kernelsim.cost.lint import BLOCK_SHAPE_REJECTED


def test_compare_locates_the_first_bad_element_and_its_block():
    want = np.zeros((8, 8), np.float32)
    got = want.copy()
    assert verdict.compare(got, want, 1e-5, 1e-5) is None
    got[5, 6] = 1.0
    msg = verdict.compare(got, want, 1e-5, 1e-5, block=(4, 4))
    assert "1 of 64 elements differ; first at [5, 6]" in msg
    assert "output block (1, 1) of (2, 2)" in msg
    assert "edge block" not in msg  # 8 = 2 x 4: the last block is whole, no hint
    partial = verdict.compare(np.ones((7, 8), np.float32), np.zeros((7, 8), np.float32),
                              1e-5, 1e-5, block=(4, 4))
    assert "output block (0, 0) of (2, 2)" in partial and "edge block" not in partial
    got7 = np.zeros((7, 8), np.float32)
    got7[6, 0] = 1.0
    assert "partial edge block" in verdict.compare(got7, np.zeros((7, 8), np.float32),
                                                   1e-5, 1e-5, block=(4, 4))
    got[0, 0] = np.nan
    assert "2 of 64" in verdict.compare(got, want, 1e-5, 1e-5)
    assert "shape (8,)" in verdict.compare(np.zeros(8, np.float32), want, 1e-5, 1e-5)
    assert "dtype float64" in verdict.compare(want.astype(np.float64), want, 1e-5, 1e-5)


def _add_trace():
    import kernelsim

    x = jnp.ones((256, 256), jnp.float32)
    return kernelsim.trace(lambda a, b: examples.add(a, b, block=(128, 128)), x, x)


def test_facts_keep_what_the_rules_read_and_refuse_garbage():
    t = _add_trace()
    facts = verdict.facts_from_dict(json.loads(json.dumps(t.to_dict())))
    (call,) = facts.calls
    assert call.grid == tuple(t.calls[0].grid)
    assert call.hbm_read_bytes == t.calls[0].hbm_read_bytes
    assert [o.block_shape for o in call.operands] == \
        [tuple(o.block_shape) for o in t.calls[0].operands]
    for bad in (None, {"calls": "x"}, {"calls": [{"operands": [], "grid": "a"}]},
                {"calls": [{"operands": [{"fetches": True}], "grid": [1]}]}):
        with pytest.raises(ValueError):
            verdict.facts_from_dict(bad)


def _case(task_id: str, hidden: bool):
    refdir = refs.REPO / "exercises" / "refs"
    manifest = refs.load_manifest(refdir)
    entry = next(e for e in manifest["cases"].values()
                 if e["task"] == task_id and e["hidden"] == hidden)
    return refdir, manifest, entry, *refs.load_case(refdir, entry)


def _whole_call(grid=(), warnings=()):
    return verdict.facts_from_dict({"calls": [{
        "name": "k", "grid": list(grid), "dimension_semantics": ["arbitrary"] * len(grid),
        "operands": [], "hbm_read_bytes": 0, "hbm_write_bytes": 0, "onchip_peak_bytes": 0,
        "warnings": list(warnings)}]})


# kernelsim's lint of a (4, 100) block, as the trace carries it
REJECTED_BLOCK = ("operand 'x_ref': block (4, 100) breaks TPU's (8, 128) tiling rule (float32): "
                  "last dim 100 is neither a multiple of 128 nor the array's 128. Nearest legal "
                  f"block: (8, 128). {BLOCK_SHAPE_REJECTED}.")


HONEST_ADD_WORK = {
    "outputs": [{"from": "pallas_call #0", "kind": "kernel"}], "outside_flops": 0,
    "outside_ops": [], "outside_while_flops": 0, "callbacks": [], "outside_moved_bytes": 0,
    "calls": [{"number": 0, "primitives": ["add", "get", "swap"], "unread": [],
               "course_kernel": False, "jax_kernel": False, "fingerprint": "0" * 64,
               "dma": None, "operands": [
                   {"role": "input", "from": "inputs", "kind": "input",
                    "floating": True}] * 2}]}


def test_decide_values_then_structure():
    _, manifest, entry, inputs, expected, params = _case("add", False)

    whole = _whole_call()

    def result(output=expected, error=None, trace=whole, work=HONEST_ADD_WORK,
               trace_error=None):
        return verdict.CaseResult(entry, inputs, expected, params, output, error, trace,
                                  trace_error, work and verdict.work_from_dict(work))

    assert verdict.decide("add", [result()]).passed
    assert "wrong values for case" in verdict.decide("add", [result(expected * 2 + 1)]).message
    raised = result(None, "NotImplementedError: ")
    assert "not implemented" in verdict.decide("add", [raised]).message
    none = verdict.decide("add", [result(trace=None, work=None,
                                         trace_error="no pallas_call was reached")])
    assert not none.passed and "never calls pl.pallas_call" in none.message
    v = verdict.decide("add", [result(trace=_whole_call((2,)))])
    assert not v.passed and "grid" in v.message
    # every case is judged on its own run: a later case's structure counts too
    v = verdict.decide("add", [result(), result(trace=_whole_call((2,)))])
    assert not v.passed and "grid" in v.message


def _add_result(output=None, trace=None, error=None, work=HONEST_ADD_WORK):
    """A visible case of ``add``: right values, one whole-array call and the honest kernel's
    work unless ``output``, ``trace`` or ``work`` says otherwise."""
    _, _, entry, inputs, expected, params = _case("add", False)
    return verdict.CaseResult(entry, inputs, expected, params,
                              expected if output is None and error is None else output, error,
                              _whole_call() if trace is None else trace, None,
                              verdict.work_from_dict(work))


def test_a_failed_check_lists_every_failure_at_once():
    """Wrong values, a wrong grid and a block Mosaic rejects, in one message (issue 37: the
    grid and block rules showed only once the values were right)."""
    wrong = _add_result(_case("add", False)[4] * 2 + 1, _whole_call((2,), [REJECTED_BLOCK]))
    for hidden in (False, True):
        v = verdict.decide("add", [wrong], hidden=hidden)
        assert not v.passed
        assert v.message.startswith("add: wrong values for "), v.message
        assert "[FAIL] grid" in v.message, v.message
        assert "[FAIL] block shapes Mosaic accepts" in v.message, v.message
    visible = verdict.decide("add", [wrong])
    grid = "[FAIL] grid: required () (one kernel instance, whole arrays); found (2,)"
    assert grid in visible.message and grid in visible.rules, visible.message


def test_each_failed_rule_is_named_once_under_the_first_case_it_failed_on():
    two = [_add_result(trace=_whole_call((2,))), _add_result(trace=_whole_call((3,)))]
    message = verdict.decide("add", two).message
    assert message.count("[FAIL] grid") == 1 and "found (2,)" in message, message
    raised = _add_result(error="ValueError: no", trace=_whole_call((2,)))
    message = verdict.decide("add", [raised, _add_result(trace=_whole_call((2,)))]).message
    assert "your function raised on case v0" in message and "[FAIL] grid" in message, message
    stub = _add_result(error="NotImplementedError: ")
    assert verdict.decide("add", [stub, _add_result(trace=_whole_call((2,)))]).message == \
        "add: not implemented yet"


def test_a_rule_is_reported_where_it_applies():
    """The scalar-prefetch rule for a kernel with scalar prefetch, the dot-precision rule for a
    kernel with a dot; neither for a kernel with neither (issue 37: "scalar prefetch carries
    indices ... found it does" of a kernel without any)."""
    def about(rules):
        return [r for r in rules if "scalar prefetch carries" in r or "dot precision" in r]

    assert about(verdict.decide("add", [_add_result()]).rules) == []
    call = HONEST_ADD_WORK["calls"][0]
    indexed = {**HONEST_ADD_WORK, "calls": [{
        **call, "primitives": [*call["primitives"], "dot_general"],
        "operands": [{"role": "scalar_prefetch", "from": "inputs", "kind": "input",
                      "floating": False}, *call["operands"]]}]}
    v = verdict.decide("add", [_add_result(work=indexed)])
    assert v.passed and len(about(v.rules)) == 2 and all(r.startswith("[ok  ]")
                                                         for r in about(v.rules)), v.rules


@pytest.mark.parametrize("hidden", [False, True])
def test_listing_every_failure_changes_no_decision(hidden):
    """A check passes exactly when every case's values are right and every rule holds: what the
    message lists decides nothing."""
    right = _case("add", False)[4]
    for output in (right, right + 1):
        for grid in ((), (2,)):
            for warnings in ((), (REJECTED_BLOCK,)):
                v = verdict.decide("add", [_add_result(output, _whole_call(grid, warnings))],
                                   hidden=hidden)
                assert v.passed == (output is right and grid == () and not warnings), \
                    (output is right, grid, warnings, v.message)


def test_checks_in_reads_only_graded_cells():
    cell = nbformat.v4.new_code_cell('course.check("add", add)\ncourse.check("add", add, '
                                     'hidden=True)')
    assert trusted.checks_in(cell) == []
    cell.metadata["nbgrader"] = {"grade": True, "points": 1}
    assert trusted.checks_in(cell) == [("add", False, "add"), ("add", True, "add")]
    cell.source = "course.check(("
    assert trusted.checks_in(cell) == []


def test_cell_changes_name_each_kind_of_edit(tmp_path):
    def nb(*cells):
        return nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell(src, metadata={"nbgrader": {
                "grade_id": gid, "grade": True, "locked": True, "points": 1}})
            for gid, src in cells])

    release, sub = tmp_path / "r.ipynb", tmp_path / "s.ipynb"
    nbformat.write(nb(("a", "check(a)"), ("b", "check(b)")), release)
    cases = {
        (): [("a", "check(a)"), ("b", "check(b)")],
        ("was edited",): [("a", "pass"), ("b", "check(b)")],
        ("deleted",): [("b", "check(b)")],
        ("appears 2 times",): [("a", "check(a)"), ("a", "check(a)"), ("b", "check(b)")],
        ("reordered",): [("b", "check(b)"), ("a", "check(a)")],
    }
    for words, cells in cases.items():
        nbformat.write(nb(*cells), sub)
        found = cell_changes(release, sub)
        assert len(found) == len(words) and all(w in f for w, f in zip(words, found,
                                                                        strict=True)), found
    edited = nb(("a", "check(a)"), ("b", "check(b)"))
    edited.cells[0].metadata.nbgrader["points"] = 100
    nbformat.write(edited, sub)
    assert any("metadata of a" in f for f in cell_changes(release, sub))
