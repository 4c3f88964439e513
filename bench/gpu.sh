#!/usr/bin/env bash
# bench/gpu.sh: the bundled workload on one NVIDIA GPU, GPT-2-medium-size model in bf16, fixed step count.
# Prints samples/s, tokens/s and MFU against the GPU's dense bf16 peak. Needs no network; finishes in
# well under 8 minutes on an H100/H200 (install from local wheels ~2-3 min, data ~1 min, training < 1 min).
#
#   bash bench/gpu.sh                   from the repository root (only app/ and this script are used)
#
# Environment (all optional):
#   PYTHON=python3          interpreter to use when it already has torch (CUDA), transformers, accelerate
#   GPU_WHEELS=DIR          wheel folder to install from when it does not (default: build/gpu-wheels)
#   GPU_VENV=DIR            where that venv goes (default: $OUT/venv)
#   OUT=DIR                 results and scratch (default: build/bench-gpu); results in $OUT/gpu-bench.json
#   STEPS=30 BATCH=16 BLOCK=1024 WARMUP=10   fixed run length and shape
#   PEAK_TFLOPS=X           dense bf16 peak of the GPU when its name is not known below
#
# The wheels, downloaded on a host with internet access (same CPU architecture and Python minor version
# as the GPU machine; add `--python-version 3.X --platform manylinux_2_28_x86_64` to download for another
# Python), then carried to the GPU machine:
#   pip download -d build/gpu-wheels --only-binary=:all: \
#       --index-url https://download.pytorch.org/whl/cu128 --extra-index-url https://pypi.org/simple \
#       torch==2.13.0 transformers==5.24.0 accelerate==1.15.0 tokenizers==0.23.3 safetensors numpy
# (cu128: pick the CUDA build the machine's driver supports, `nvidia-smi` shows "CUDA Version". The torch
# CUDA wheel pulls the nvidia-* runtime wheels and triton: about 3 GB in all.)
#
# Model: GPT-2 medium's shape (n_layer 24, n_embd 1024, n_head 16, context 1024) with the embedded
# 4,096-token vocabulary (~303 M parameters instead of GPT-2 medium's 355 M), trained from scratch on
# the embedded corpus with `--bf16` (autocast), no DeepSpeed. MFU = 6 * params * tokens/s / peak
# (train.metrics; attention FLOPs left out, so it understates the true utilisation slightly).
set -Eeuo pipefail

cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/build/bench-gpu}"
STEPS="${STEPS:-30}"
BATCH="${BATCH:-16}"
BLOCK="${BLOCK:-1024}"
WARMUP="${WARMUP:-10}"
WHEELS="${GPU_WHEELS:-$ROOT/build/gpu-wheels}"
VENV="${GPU_VENV:-$OUT/venv}"
PY="${PYTHON:-python3}"

say() { printf 'gpu-bench: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}

mkdir -p "$OUT"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found; fix: run on a machine with an NVIDIA GPU and driver"
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
say "GPU: $gpu_name"

peak="${PEAK_TFLOPS:-}"
if [[ -z "$peak" ]]; then
	case "$gpu_name" in
		*H200* | *H100*) peak=989 ;; # dense bf16, SXM
		*A100*) peak=312 ;;
		*L40S*) peak=362 ;;
		*) die "no bf16 peak known for '$gpu_name'; fix: set PEAK_TFLOPS (dense bf16 TFLOP/s)" ;;
	esac
fi

usable() { "$1" -c 'import torch, transformers, accelerate, tokenizers, numpy; assert torch.cuda.is_available()' 2>/dev/null; }

if usable "$PY"; then
	say "using $PY (torch with CUDA already installed)"
else
	[[ -d "$WHEELS" ]] || die "$PY lacks torch with CUDA and there is no wheel folder $WHEELS; fix: see the header of $0"
	command -v "$PY" >/dev/null || die "$PY not found; fix: set PYTHON"
	if [[ ! -x "$VENV/bin/python" ]]; then
		say "creating $VENV and installing from $WHEELS (no index)"
		"$PY" -m venv "$VENV"
	fi
	"$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" \
		torch transformers accelerate tokenizers safetensors numpy
	PY="$VENV/bin/python"
	usable "$PY" || die "the installed torch cannot use the GPU; fix: download the CUDA build matching the driver"
fi

export PYTHONPATH="$ROOT/app${PYTHONPATH:+:$PYTHONPATH}"
export GAUDI_CLUSTER_DATA_DIR="$OUT/data" TOKENIZERS_PARALLELISM=false
say "embedded data and tokenizer (deterministic, built once)"
"$PY" -m train.data --out "$OUT/data" >&2

config="$OUT/gpt2-medium-4k.json"
cat >"$config" <<JSON
{
  "model_type": "gpt2",
  "vocab_size": 4096,
  "n_positions": 1024,
  "n_embd": 1024,
  "n_layer": 24,
  "n_head": 16,
  "activation_function": "gelu_new",
  "resid_pdrop": 0.0,
  "embd_pdrop": 0.0,
  "attn_pdrop": 0.0,
  "layer_norm_epsilon": 1e-05,
  "initializer_range": 0.02,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "tie_word_embeddings": true,
  "use_cache": false
}
JSON

run="$OUT/run"
rm -rf "$run"
say "training $STEPS steps, batch $BATCH x $BLOCK tokens, bf16, peak $peak TFLOP/s"
start=$(date +%s)
timeout 420 "$PY" -u "$ROOT/app/train/run_clm.py" --do_train --config_name "$config" --output_dir "$run" \
	--max_steps "$STEPS" --per_device_train_batch_size "$BATCH" --block_size "$BLOCK" --bf16 \
	--throughput_warmup_steps "$WARMUP" --peak_tflops "$peak" --save_strategy no --no_save_last_ckpt --no_plot \
	--logging_steps 10 --dataloader_num_workers 2 --report_to none >"$OUT/train.log" 2>&1 \
	|| {
		tail -n 40 "$OUT/train.log" >&2
		die "training failed (log: $OUT/train.log)"
	}
say "training run took $(($(date +%s) - start)) s (imports, data, model and $STEPS steps)"

"$PY" - "$run/train_results.json" "$OUT/gpu-bench.json" "$gpu_name" <<'PYEOF'
import json
import sys

results = json.load(open(sys.argv[1]))
summary = {
    "gpu": sys.argv[3],
    "params": results.get("n_params"),
    "steps": results.get("global_step"),
    "global_batch": results.get("global_batch_size"),
    "samples_per_second": results.get("train_samples_per_second"),
    "tokens_per_second": results.get("train_tokens_per_second"),
    "mfu": results.get("mfu"),
    "peak_tflops": results.get("peak_tflops_per_device"),
    "max_memory_allocated_gb": results.get("max_memory_allocated (GB)"),
    "warmup_steps_excluded": results.get("throughput_warmup_steps_applied"),
}
json.dump(summary, open(sys.argv[2], "w"), indent=1)
print(f"samples/s {summary['samples_per_second']}  tokens/s {summary['tokens_per_second']}  "
      f"MFU {100 * (summary['mfu'] or 0):.1f}% of {summary['peak_tflops']} TFLOP/s bf16  "
      f"({summary['params'] / 1e6:.0f} M params, {summary['gpu']})")
PYEOF
