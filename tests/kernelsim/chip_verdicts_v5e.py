"""What the real compiler said on a TPU v5e, recorded as expected values for CPU tests.

Run: the first TPU v5e run of the course (2026-12-05; jax and jaxlib 0.10.2, libtpu
0.0.42.1, at commit 936be9a), written up in the project's shared notes (tpu-v5e.md, "VMEM"
and "Block shapes"). ``bench/tpu_perf.py`` records the same sweeps again
(``bench/recorded/tpu_perf-v5e.json``, ``vmem`` and ``lint``); add its verdicts here when
they add a case.
"""

MiB = 1 << 20

# Lesson 7's matmul (bfloat16 4096 x 4096 operands, float32 accumulator scratch) at default
# compiler params: blocks (bm, bk, bn) -> Mosaic's own allocation in MiB when it refused
# (CompileTimeScopedVmemOom, "... > 16.00M"), None when it compiled.
MATMUL_VMEM = {
    (512, 1024, 1024): None,
    (1024, 512, 1024): None,
    (1024, 768, 1024): None,
    (1024, 896, 1024): 17.13,
    (1024, 1024, 1024): 18.36,
    (512, 2048, 1024): 18.08,
    (1024, 1280, 1024): 18.00,
    (1024, 1536, 1024): 20.00,
    (2048, 512, 1024): 22.00,
    # bench/tpu_perf.py's sweep, recorded at f1c4f1f (bench/recorded/tpu_perf-v5e.json, vmem)
    (768, 1024, 1024): None,
    (1024, 640, 1024): None,
    (512, 1536, 1024): None,
}
DEFAULT_SCOPED_VMEM = 16 * MiB  # "limit 16.00M" in every refusal above

# A copy kernel's block over an array: (array shape, block shape, dtype) -> compiled on the
# chip. Only the cases where the chip disagreed with JAX's CPU-side lowering check
# (``kernelsim.tpu_lowering_error``), which accepts all of these.
COPY_BLOCKS = {
    ((32, 256), (8, 256), "int8"): False,   # "Failed to set window params"
    ((32, 256), (16, 256), "int8"): False,  # int8 blocks of 8 or 16 rows: rejected
    ((32, 256), (8, 256), "float16"): False,  # "Invalid vector type for load"
    ((32, 256), (8, 256), "int16"): True,
    ((32, 256), (8, 256), "bfloat16"): True,  # bfloat16 blocks of 8 rows are accepted
}

# "Two 9 MiB windows": a (100 MiB,) int8 output written in 9 MiB blocks whose index map
# moves, so Mosaic double-buffers it (test_tpu_rules._one_window): refused
# (CompileTimeScopedVmemOom), while kernelsim before this table warned from 20 MiB only.
TWO_9_MIB_WINDOWS_COMPILED = False

# Assignment 14's kv_cache_append (float32 cache (12, 16, 128), new_rows (3, 1, 128), a (3, 4)
# int32 page table and (3,) positions as scalar prefetch), each variant of the page's index map
# in a process of its own (bench/kv_halt_probe.py; bench/recorded/kv_halt_probe-v5e.json):
# True where it ran, False where the core halted (E0200 RuntimeUnexpectedCoreHalt, the
# process lost). The table read at an index read from the positions halts whatever the form;
# the table or the positions read at the step's own index run. Each variant's index map places
# the output block too (the cache, aliased); input index maps of the halting form ran: lesson
# 15's paged_decode reads page_table[s * slots + min(p, last_page(kv_lens[s]))] for its K and
# V pages and passed compiled (bench/recorded/on_tpu-v5e.json), as JAX's paged attention does.
KV_INDEX_MAP_RAN = {
    "table[s, positions[s] // 16] (2-D table)": False,
    "table[s * 4 + positions[s] // 16] (1-D table)": False,
    "table[s * 4 + (positions[s] >> 4)]": False,
    "table[s * 4 + lax.div(positions[s], 16)]": False,
    "table[s * 4]": True,
    "positions[s] // 16": True,
    "0 (a constant page)": True,
}
INPUT_INDEX_MAP_OF_THE_HALTING_FORM_RAN = True
