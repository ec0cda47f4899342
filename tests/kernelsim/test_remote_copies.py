"""kernelsim traces pallas_calls inside ``jax.shard_map`` on four interpret-mode devices: every
remote copy it predicts (bytes, source and destination device) is one TPU interpret mode
performs, and the kernels' values equal plain JAX's.

JAX reads the number of CPU devices once, when its backend starts, and pytest has started it
by now; so the checks run in a fresh Python (this file run as a script, with the device flag
set before JAX is imported) and report back as JSON.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpret

DEVICES = 4
ROOT = Path(__file__).resolve().parents[2]


def ring_all_gather_kernel(x_ref, o_ref, send_sems, recv_sems):
    """Step s: forward the shard that arrived last to the right-hand neighbour, into the
    same rows of its output (the ring all-gather of lesson 14, written again here)."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    n_dev = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, n_dev)
    m = x_ref.shape[0]
    o_ref[pl.ds(me * m, m), :] = x_ref[...]
    for step in range(DEVICES - 1):
        rows = o_ref.at[pl.ds(jax.lax.rem(me - step + n_dev, n_dev) * m, m)]
        copy = pltpu.make_async_remote_copy(rows, rows, send_sems.at[step],
                                            recv_sems.at[step], device_id={"x": right})
        copy.start()
        copy.wait()


def collective_matmul_kernel(x_ref, w_ref, o_ref, shards, send_sems, recv_sems):
    """Multiply the row block on hand while it travels left-to-right round the ring; this one
    sends to the device on the *left*, named by a bare index (a one-axis mesh's coordinate)
    rather than the all-gather's ``{"x": right}``, so the two cover both forms."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    n_dev = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    left = jax.lax.rem(me - 1 + n_dev, n_dev)
    m = x_ref.shape[0]
    shards[me] = x_ref[...]
    for step in range(DEVICES):
        shard = jax.lax.rem(me + step, n_dev)  # arrives from the right each step
        copy = None
        if step < DEVICES - 1:
            copy = pltpu.make_async_remote_copy(shards.at[shard], shards.at[shard],
                                                send_sems.at[step], recv_sems.at[step],
                                                device_id=left)
            copy.start()
        o_ref[pl.ds(shard * m, m), :] = jnp.dot(shards[shard], w_ref[...],
                                                preferred_element_type=jnp.float32)
        if copy is not None:
            copy.wait()


def leading_rows_kernel(n_ref, x_hbm, o_ref, sem):
    """Copy the first ``n_ref[0]`` rows of this device's shard (HBM) into the output block,
    zeros below: a local DMA whose size differs from device to device."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)  # the interpreter starts outputs at NaN
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n_ref[0])], o_ref.at[pl.ds(0, n_ref[0])],
                                 sem)
    copy.start()
    copy.wait()


def _checks() -> dict:
    """Run in the subprocess: trace and verify both kernels, return what the test asserts."""

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import PartitionSpec as P

    import kernelsim
    from kernelsim.verify import verify

    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:DEVICES]), ("x",))
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    sems = [pltpu.SemaphoreType.DMA((DEVICES,)), pltpu.SemaphoreType.DMA((DEVICES,))]

    def all_gather(x, interpret=True):
        def local(x):
            return pl.pallas_call(
                ring_all_gather_kernel,
                out_shape=jax.ShapeDtypeStruct((DEVICES * x.shape[0], x.shape[1]), x.dtype),
                in_specs=[vmem], out_specs=vmem, scratch_shapes=sems, interpret=interpret)(x)

        return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             check_vma=False)(x)

    def matmul(x, w, interpret=True):
        def local(x, w):
            m, k = x.shape
            return pl.pallas_call(
                collective_matmul_kernel,
                out_shape=jax.ShapeDtypeStruct((DEVICES * m, w.shape[1]), jnp.float32),
                in_specs=[vmem, vmem], out_specs=vmem,
                scratch_shapes=[pltpu.VMEM((DEVICES, m, k), x.dtype), *sems],
                interpret=interpret)(x, w)

        return jax.shard_map(local, mesh=mesh, in_specs=(P("x", None), P(None, "x")),
                             out_specs=P(None, "x"), check_vma=False)(x, w)

    def leading_rows(x, interpret=True):
        def local(x):  # how many rows: computed from the device's index, outside the kernel
            n = (2 * jax.lax.axis_index("x") + 2).astype(jnp.int32).reshape(1)
            return pl.pallas_call(
                leading_rows_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                grid_spec=pltpu.PrefetchScalarGridSpec(
                    num_scalar_prefetch=1, grid=(1,),
                    in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                    out_specs=pl.BlockSpec(x.shape, lambda i, n: (0, 0)),
                    scratch_shapes=[pltpu.SemaphoreType.DMA(())]),
                interpret=interpret)(n, x)

        return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             check_vma=False)(x)

    keys = jax.random.split(jax.random.key(26), 3)
    x = jax.random.normal(keys[0], (DEVICES * 8, 128), jnp.float32)
    xm = jax.random.normal(keys[1], (DEVICES * 16, 128), jnp.float32)
    wm = jax.random.normal(keys[2], (128, DEVICES * 128), jnp.float32)
    out: dict = {"devices": len(jax.devices("cpu"))}
    for name, fn, args, reference in (
            ("all_gather", all_gather, (x,), np.tile(np.asarray(x), (DEVICES, 1))),
            ("matmul", matmul, (xm, wm), np.asarray(jnp.dot(xm, wm, precision="highest"))),
            ("leading_rows", leading_rows, (x,), np.asarray(x) * (
                np.arange(DEVICES * 8)[:, None] % 8 < 2 * (np.arange(DEVICES * 8)[:, None] // 8)
                + 2))):
        trace = kernelsim.trace(fn, *args)
        v = verify(fn, *args)
        out[name] = {
            "traced": [[c.call.device.id, [[d.step, d.src_device, d.dst_device, d.bytes,
                                            d.semaphore] for d in c.call.body_copies]]
                       for c in trace.calls],
            "verified": [[c.call.device.id, [[d.step, d.src_device, d.dst_device, d.bytes]
                                             for d in c.call.body_copies]]
                         for c in v.trace.calls],
            "checks": [[d.call, d.route, d.model_bytes, d.interpreter_bytes]
                       for d in v.body_dma_checks],
            "pipeline_ok": all(c.copies_match and c.bytes_match for c in v.checks),
            "ok": v.ok,
            "max_error": float(np.max(np.abs(np.asarray(v.outputs) - reference))),
            "run_error": float(np.max(np.abs(np.asarray(
                kernelsim.run(fn, *args, interpret=pltpu.InterpretParams())[0]) - reference))),
            "summary": trace.summary(),
            "to_dict": trace.to_dict()["calls"][1]["body_dmas"],
        }
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                        f"--xla_force_host_platform_device_count={DEVICES}".strip()}
    done = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_four_devices(results):
    assert results["devices"] == DEVICES


@pytest.mark.parametrize("name, step_bytes, direction", [
    ("all_gather", 8 * 128 * 4, +1), ("matmul", 16 * 128 * 4, -1)])
def test_each_device_sends_one_shard_a_step_to_its_neighbour(results, name, step_bytes,
                                                             direction):
    traced = results[name]["traced"]
    assert [device for device, _ in traced] == list(range(DEVICES))
    for device, copies in traced:
        assert copies == [[0, device, (device + direction) % DEVICES, step_bytes,
                           f"recv_sems[{s}]"] for s in range(DEVICES - 1)]
    # verify analyses the same program as trace, device by device
    assert results[name]["verified"] == [[d, [c[:4] for c in cs]] for d, cs in traced]


@pytest.mark.parametrize("name", ["all_gather", "matmul"])
def test_every_remote_copy_is_one_the_interpreter_performs(results, name):
    r = results[name]
    assert r["ok"] and r["pipeline_ok"]
    direction = 1 if name == "all_gather" else -1
    routes = {(call, route) for call, route, _, _ in r["checks"]}
    assert routes == {(d, f"vmem -> vmem, device {d} -> {(d + direction) % DEVICES}")
                      for d in range(DEVICES)}
    for _, _, model, interpreter in r["checks"]:
        assert model == interpreter and len(model) == DEVICES - 1


@pytest.mark.parametrize("name, tolerance", [("all_gather", 0.0), ("matmul", 1e-3)])
def test_values_equal_plain_jax(results, name, tolerance):
    assert results[name]["max_error"] <= tolerance  # as verify ran it
    assert results[name]["run_error"] <= tolerance  # kernelsim.run, the map run whole


def test_local_copies_in_a_mesh_are_sized_per_device(results):
    """A size computed from ``axis_index`` outside the kernel: device d copies 2d + 2 rows
    of its own shard, from its HBM into its VMEM, as the interpreter does."""
    r = results["leading_rows"]
    assert r["ok"] and r["max_error"] == 0.0
    assert r["verified"] == [[d, [[0, d, d, (2 * d + 2) * 128 * 4]]] for d in range(DEVICES)]
    assert {route for _, route, _, _ in r["checks"]} == {
        f"hbm -> vmem, device {d} -> {d}" for d in range(DEVICES)}


def test_summary_and_dict_name_the_devices(results):
    summary = results["all_gather"]["summary"]
    assert "on device 1 (x=1)" in summary
    assert "remote copies: 3, 12,288 B sent; step 0: 4,096 B device 1 -> 2" in summary
    first = results["all_gather"]["to_dict"][0]
    assert (first["src_device"], first["dst_device"], first["bytes"]) == (1, 2, 4096)


if __name__ == "__main__":
    print(json.dumps(_checks()))
