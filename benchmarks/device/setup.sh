# There, at the start of a device-machine command (source it from the repository root):
#   source benchmarks/device/setup.sh && python benchmarks/general.py lodo --config configs/cluster/1gpu.yaml ...
# Installs the carried wheels into /tmp/site, unpacks the data into /tmp/data (TOOLGRAPH_DATA), and
# puts all-MiniLM-L6-v2 (fp32 again) into the Hugging Face cache, where toolgraph finds it by name.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export TOOLGRAPH_DATA=/tmp/data
# the image has JAX, which transformers may import: it would take 75 % of the GPU's memory per process
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/data && tar xJf .device/data.tar.xz -C /tmp/data
hub=${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}/models--sentence-transformers--all-MiniLM-L6-v2
rev=0000000000000000000000000000000000f9f16e  # a local snapshot name (fp16 -> fp32 copy of the PyPI package)
mkdir -p "$hub/refs" "$hub/snapshots/$rev" && printf %s "$rev" > "$hub/refs/main"
cp -r .device/minilm/. "$hub/snapshots/$rev/"
python3 - "$hub/snapshots/$rev/model.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
save_file({k: v.float() for k, v in state.items()}, sys.argv[1], metadata={"format": "pt"})
PY
set +e
