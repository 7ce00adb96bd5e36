#!/usr/bin/env bash
# The Python environment of the framework checks (scripts/check-frameworks.sh,
# scripts/bench-frameworks.sh): a virtual environment in .venv at the repository root with
# pinned PyTorch, torchvision, TensorFlow (CPU) and Pillow from the default PyPI index.
#
# Idempotent: when .venv already holds exactly these versions it installs nothing; either
# way it imports every package to verify it and prints the versions it found.
#
# Nothing here needs a GPU. PyTorch's default wheel on PyPI still brings its CUDA libraries
# (nvidia-* packages, about 3 GB; about 2 minutes here): torch cannot be imported without
# them, and the CPU-only wheels live on an index that is not always reachable.
#
#   scripts/setup-python.sh
#   PYTHON=python3.12 VENV=/opt/venv scripts/setup-python.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-$PWD/.venv}
# Pinned so that a result quoted in the README can be reproduced with the same libraries.
PINS=(torch==2.15.0 torchvision==0.29.2 tensorflow-cpu==2.21.0 pillow==13.0.0)

if [ ! -x "$VENV/bin/python" ]; then
    echo "== creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"

# Prints the pins that are not installed at exactly their version.
missing() {
    "$py" - "${PINS[@]}" <<'PY'
import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        print(pin)
PY
}

todo=$(missing)
if [ -n "$todo" ]; then
    echo "== installing: $(echo $todo)"
    "$py" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
    todo=$(missing)
    if [ -n "$todo" ]; then
        echo "setup-python.sh: still not at the pinned versions: $(echo $todo)" >&2
        exit 1
    fi
else
    echo "== $VENV already has ${PINS[*]}"
fi

# Import everything (this is what the pipelines need) and print what is there.
"$py" - <<'PY'
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
import PIL, torch, torchvision, tensorflow as tf
print(f"python      {sys.version.split()[0]} ({sys.prefix})")
print(f"torch       {torch.__version__} (CUDA available: {torch.cuda.is_available()})")
print(f"torchvision {torchvision.__version__}")
print(f"tensorflow  {tf.__version__}")
print(f"pillow      {PIL.__version__}")
PY
