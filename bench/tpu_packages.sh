#!/bin/sh
# Run a command on a TPU machine like the course's (Python 3.11, jax 0.10.2 + libtpu, numpy,
# scipy, pytest; its own package index at /opt/pypi; no network) with what the lessons and the
# assignments import beside JAX: matplotlib (the lessons' figures, kernelsim's views) and absl-py
# (JAX's Mosaic GPU modules import it). Both come from the machine's own index, installed into
# $TPU_SITE (default /tmp/site) and put on PYTHONPATH for the command. Nothing else is needed:
# bench/on_device.py runs cells in-process and reads the notebooks itself, so no jupytext,
# Jupyter kernel or anywidget.
#
# Usage: sh bench/tpu_packages.sh python3 bench/on_device.py --record --out "$OUT"
set -eu
site=${TPU_SITE:-/tmp/site}
index=${TPU_INDEX:-file:///opt/pypi/simple}
# --no-deps with matplotlib's dependencies named: a --target install would otherwise put a
# second numpy beside the machine's own
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-deps --no-compile \
    --no-cache-dir --only-binary=:all: --index-url "$index" --target "$site" \
    matplotlib contourpy cycler fonttools kiwisolver packaging pillow pyparsing \
    python-dateutil six absl-py
PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site" exec "$@"
