"""A ring all-gather over four interpret-mode devices whose remote copies span grid steps:
step s waits on the copy started at step s - 1 and starts the next, so each copy is in flight
over two steps. Run as a script (JAX must see four CPU devices before it starts, see
``run``) it traces the ring, writes its standalone viewer to ``DIR/ring.html`` and prints,
as JSON, the Trace's dict and the viewer's data for the tests to compare."""

import json
import os
import subprocess
import sys
from pathlib import Path

DEVICES = 4
ROOT = Path(__file__).resolve().parents[3]


def ring_kernel(x_ref, o_ref, send_sems, recv_sems):
    """Grid step s forwards shard (me - s) to the right-hand neighbour, after waiting for the
    copy of step s - 1 that brought it in."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    s = pl.program_id(0)
    n_dev = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, n_dev)
    m = x_ref.shape[0]

    def copy(step):
        rows = o_ref.at[pl.ds(jax.lax.rem(me - step + n_dev, n_dev) * m, m)]
        return pltpu.make_async_remote_copy(rows, rows, send_sems.at[step], recv_sems.at[step],
                                            device_id={"x": right})

    @pl.when(s == 0)
    def _():
        o_ref[pl.ds(me * m, m), :] = x_ref[...]

    @pl.when(s > 0)
    def _():
        copy(s - 1).wait()

    @pl.when(s < DEVICES - 1)
    def _():
        copy(s).start()


def _main(out: Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import PartitionSpec as P

    import kernelsim
    from kernelsim.views.viewer import viewer_data

    mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:DEVICES]), ("x",))
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)

    def all_gather(x):
        def local(x):
            return pl.pallas_call(
                ring_kernel, grid=(DEVICES,),
                out_shape=jax.ShapeDtypeStruct((DEVICES * x.shape[0], x.shape[1]), x.dtype),
                in_specs=[vmem], out_specs=vmem,
                scratch_shapes=[pltpu.SemaphoreType.DMA((DEVICES,))] * 2, interpret=True)(x)

        return jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             check_vma=False)(x)

    t = kernelsim.trace(all_gather, jnp.ones((DEVICES * 8, 256), jnp.float32))
    t.to_html(out / "ring.html", call=1)
    print(json.dumps({"trace": t.to_dict(), "viewer": viewer_data(t, 1)}))


def run(out: Path) -> dict:
    """Run this file in a fresh Python with four CPU devices; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                        f"--xla_force_host_platform_device_count={DEVICES}".strip()}
    done = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    _main(Path(sys.argv[1]))
