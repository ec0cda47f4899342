"""kernelsim.backend: how a kernel runs here. One mapping from the course's ``interpret`` to a
Mosaic GPU kernel's, which the lessons, bench/ and the grader all call."""

from __future__ import annotations

import pytest

from kernelsim import adapter, backend


def gpu_interpret_mode():
    """The mode ``True`` stands for: GPU interpret mode, or the error naming the release."""
    if adapter.models_mosaic_gpu():
        from jax.experimental.pallas import mosaic_gpu as plgpu

        return plgpu.InterpretGPUParams
    return backend.NeedsNewerJax


def test_true_is_gpu_interpret_mode_false_is_compiled_and_params_pass_through():
    mode = gpu_interpret_mode()
    if mode is backend.NeedsNewerJax:
        with pytest.raises(backend.NeedsNewerJax, match="InterpretGPUParams"):
            backend.gpu_interpret(True)
    else:
        assert isinstance(backend.gpu_interpret(True), mode)
        params = mode(detect_races=True)
        assert backend.gpu_interpret(params) is params
    assert backend.gpu_interpret(False) is None


@pytest.mark.parametrize("platform", ["gpu", "cpu", "tpu"])
def test_no_argument_is_what_this_machine_needs(monkeypatch, platform):
    monkeypatch.setattr(backend, "platform", lambda: platform)
    if platform == "gpu":
        assert backend.gpu_interpret() is None
    elif gpu_interpret_mode() is backend.NeedsNewerJax:
        with pytest.raises(backend.NeedsNewerJax):
            backend.gpu_interpret()
    else:
        assert isinstance(backend.gpu_interpret(), gpu_interpret_mode())
