"""Hidden cases stay with the grader (issue 25): a hidden check's message names the case, its
dtype and, of the learner's own output, its shape, dtype and first wrong element; never the
expected values, the inputs' shapes, seed or parameters, the tolerance there, what a rule
found, or the text of an error the learner's code raised on hidden inputs."""

from __future__ import annotations

import numpy as np
import pytest
from test_verdict import HONEST_ADD_WORK, _case, _whole_call

from grader.verdict import verdict


def _hidden_add(**changes):
    _, _, entry, inputs, expected, params = _case("add", True)
    fields = dict(output=expected, error=None, trace=_whole_call(), trace_error=None,
                  work=verdict.work_from_dict(HONEST_ADD_WORK))
    fields.update(changes)
    return entry, inputs, expected, verdict.CaseResult(entry, inputs, expected, params,
                                                       **fields)


def _secrets(entry, inputs, expected) -> list[str]:
    """Text that would show hidden data: the inputs' shapes, the seed, an expected value."""
    out = [f"seed {entry['seed']}", "expected", "tolerance", "rtol"]
    out += [str(tuple(a.shape)) for a in inputs.values()
            if tuple(a.shape) != tuple(expected.shape)]
    flat = expected.astype(np.float64).ravel()
    out += [f"{flat[0]:.6g}", f"{flat[-1]:.6g}"]
    return out


def test_a_wrong_hidden_output_shows_the_learner_s_own_value_only():
    _, _, entry, inputs, expected, params = _case("add", True)
    wrong = expected.copy()
    wrong.ravel()[3] = 1234.5
    _, _, _, result = _hidden_add(output=wrong)
    message = verdict.decide("add", [result], hidden=True).message
    assert f"hidden case {entry['case']}" in message and "1234.5" in message, message
    assert f"shape {expected.shape}" in message  # the learner's own output's shape
    for secret in _secrets(entry, inputs, expected):
        assert secret not in message, (secret, message)
    visible = verdict.decide("add", [result]).message  # the visible form says all of it
    assert "expected" in visible and f"seed {entry['seed']}" in visible


@pytest.mark.parametrize("error", ["ValueError: shapes (4096, 1024) and (1024,) differ",
                                   "Shape_4096x1024: my own exception class"])
def test_an_error_on_a_hidden_case_shows_only_its_type(error):
    entry, inputs, expected, result = _hidden_add(output=None, error=error)
    message = verdict.decide("add", [result], hidden=True).message
    assert "4096" not in message and "1024" not in message, message
    assert ("ValueError" in message) == error.startswith("ValueError")


def test_a_failed_rule_on_a_hidden_case_shows_its_name_only():
    entry, inputs, expected, result = _hidden_add(trace=_whole_call((3, 7)))
    v = verdict.decide("add", [result], hidden=True)
    assert not v.passed and "[FAIL]" in v.message and "found" not in v.message, v.message
    assert "(3, 7)" not in v.message and v.rules == []
    missing = _hidden_add(trace=None, work=None, trace_error="NoCall: on shape (4096, 1024)")[3]
    assert "4096" not in verdict.decide("add", [missing], hidden=True).message


def test_a_passing_hidden_check_names_its_rules_only():
    *_, result = _hidden_add()
    v = verdict.decide("add", [result], hidden=True)
    assert v.passed and v.rules == [] and v.checked
