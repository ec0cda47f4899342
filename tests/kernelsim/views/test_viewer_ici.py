"""The viewer's data for kernels in a ``shard_map``: each call's device and its body DMAs
equal the Trace's, and only the TPU model of a call with remote copies has an ICI lane."""

import pytest
from ici_ring import DEVICES, run

from kernelsim.views import viewer as v

pytestmark = pytest.mark.interpret


@pytest.fixture(scope="module")
def ring(tmp_path_factory) -> dict:
    return run(tmp_path_factory.mktemp("ici"))


def test_each_call_carries_its_device_and_the_traces_body_dmas(ring):
    traced, calls = ring["trace"]["calls"], ring["viewer"]["calls"]
    assert len(calls) == len(traced) == DEVICES
    for call, t in zip(calls, traced, strict=True):
        assert call["device"] == t["device"]
        assert [{k: x for k, x in d.items() if k != "remote"} for d in call["body_dmas"]] \
            == t["body_dmas"]
        assert all(d["remote"] == (d["src_device"] != d["dst_device"])
                   for d in call["body_dmas"])
    first = calls[1]["body_dmas"][0]  # device 1 sends at step 0, waits at step 1
    assert (first["src_device"], first["dst_device"], first["bytes"], first["semaphore"],
            first["start_step"], first["wait_step"]) == (1, 2, 8 * 256 * 4, "recv_sems[0]", 0, 1)


def test_only_the_tpu_model_of_a_call_with_remote_copies_has_an_ici_lane(ring, mm_trace):
    models = ring["viewer"]["calls"][0]["models"]
    assert [lane["id"] for lane in models["tpu"]["lanes"]] == ["hbm", "vmem", "ici"]
    assert models["tpu"]["lanes"][-1]["title"] == "ICI"
    assert [lane["kind"] for lane in models["gpu"]["lanes"]] == ["arrays", "buffers", "note"]
    plain = v.viewer_data(mm_trace)["calls"][0]
    assert plain["device"] is None and plain["body_dmas"] == []
    for model in ("tpu", "gpu"):
        assert [lane["kind"] for lane in plain["models"][model]["lanes"]] == ["arrays", "buffers"]
