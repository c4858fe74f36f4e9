#!/usr/bin/env bash
# The determinism probe of the embedded engine on a GPU (or, with DEVICE=cpu, on this CPU).
#
# Why: the engine's batch invariance is measured on the CPU build it ships with; this
# shows whether the same forward pass (fixed chunks of 8 rows, attention one row at a
# time) also keeps a pinned probe bit-identical in batches of 1, 2, 8 and 32 on CUDA.
# vLLM is not needed (the GPU machine has none).
#
# What it does:
#   1. makes the shipped tiny model (or uses MODEL_DIR, a Hugging Face style directory);
#   2. if `affidavit engine serve` has a --device option, starts the server on DEVICE and
#      runs `affidavit probe` against it; otherwise it runs the same probe in-process
#      against DecoderModel on DEVICE (prefill and batched decode, per-request samplers),
#      once per linear path in LINEAR_PATHS;
#   3. prints the table(s) and exits 0 only when the first path (the engine's invariant
#      one) gave 100% bit-identical probes. Other paths are shown for comparison.
#
# Usage, from the repository root (needs `pip install -e '.[engine]'` with a CUDA torch):
#   scripts/gpu_check.sh                 # DEVICE=cuda
#   DEVICE=cpu scripts/gpu_check.sh      # the same script on this CPU
# Knobs: PYTHON, DEVICE, MODE (auto|server|inprocess), PROBES, BATCH_SIZES, MAX_TOKENS,
#        LINEAR_PATHS (in-process only), MODEL_DIR.
set -euo pipefail

cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda}"
MODE="${MODE:-auto}"
PROBES="${PROBES:-12}"
BATCH_SIZES="${BATCH_SIZES:-1,2,8,32}"
MAX_TOKENS="${MAX_TOKENS:-32}"
LINEAR_PATHS="${LINEAR_PATHS:-padded-8 fixed-chunk-8 stock}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export DEVICE PROBES BATCH_SIZES MAX_TOKENS LINEAR_PATHS

say() { printf '==> %s\n' "$*"; }

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

say "python: $PYTHON; device: $DEVICE; mode: $MODE"
"$PYTHON" - <<'PY'
import os
import sys

try:
    import torch

    import inference.make_model
    import inference.model
    import record.digest
except ImportError as exc:
    print(f"gpu_check: the engine does not import ({exc}); install it: pip install -e '.[engine]'", file=sys.stderr)
    raise SystemExit(3) from None
device = os.environ["DEVICE"]
print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: DEVICE is cuda but torch sees no CUDA device")
    print(f"device: {torch.cuda.get_device_name(0)}, cuda {torch.version.cuda}")
    print(f"tf32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}")
PY

if [[ -n "${MODEL_DIR:-}" ]]; then
    say "using the model in $MODEL_DIR"
else
    MODEL_DIR="$WORK/tiny"
    say "making the tiny model in $MODEL_DIR"
    "$PYTHON" -m affidavit engine make-model "$MODEL_DIR"
fi

DEVICE_FLAG=()
if "$PYTHON" -m affidavit engine serve --help | grep -q -- '--device'; then
    DEVICE_FLAG=(--device "$DEVICE")
fi
if [[ "$MODE" == auto ]]; then
    if [[ ${#DEVICE_FLAG[@]} -gt 0 ]]; then MODE=server; else MODE=inprocess; fi
fi
if [[ "$MODE" == server && ${#DEVICE_FLAG[@]} -eq 0 && "$DEVICE" != cpu ]]; then
    echo "gpu_check: engine serve has no --device option; use MODE=inprocess" >&2
    exit 2
fi

if [[ "$MODE" == server ]]; then
    say "starting the embedded engine: engine serve --model $MODEL_DIR --port 0 ${DEVICE_FLAG[*]:-}"
    "$PYTHON" -m affidavit engine serve --model "$MODEL_DIR" --port 0 --log-level warning \
        "${DEVICE_FLAG[@]}" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    URL=""
    for _ in $(seq 1 600); do
        URL="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$WORK/server.log" | head -n 1 || true)"
        [[ -n "$URL" ]] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            cat "$WORK/server.log" >&2
            echo "gpu_check: the server exited before it was ready" >&2
            exit 1
        fi
        sleep 0.5
    done
    if [[ -z "$URL" ]]; then
        cat "$WORK/server.log" >&2
        echo "gpu_check: the server was not ready after 300 s" >&2
        exit 1
    fi
    cat "$WORK/server.log"
    say "probing $URL: $PROBES probes x batch sizes $BATCH_SIZES, $MAX_TOKENS tokens each"
    "$PYTHON" -m affidavit probe --url "$URL" --probes "$PROBES" \
        --batch-sizes "$BATCH_SIZES" --max-tokens "$MAX_TOKENS"
    say "the probe found every probe bit-identical"
    exit 0
fi

say "probing DecoderModel in-process on $DEVICE: paths $LINEAR_PATHS; $PROBES probes x batch sizes $BATCH_SIZES, $MAX_TOKENS tokens each"
"$PYTHON" - "$MODEL_DIR" <<'PY'
"""The probe of `affidavit probe`, run against the model itself on DEVICE."""

import contextlib
import json
import os
import random
import sys
import time

import torch

from inference.model import DecoderModel
from inference.probe import ProbeConfig, ProbeResult, Row, format_table
from inference.sampling import Sampler, SamplingParams

device = torch.device(os.environ["DEVICE"])
cpu = torch.device("cpu")
# A device context routes every torch call through Python; only pay for it off the CPU.
on_device = contextlib.nullcontext() if device.type == "cpu" else device
on_cpu = contextlib.nullcontext() if device.type == "cpu" else cpu
probes = int(os.environ["PROBES"])
sizes = tuple(int(s) for s in os.environ["BATCH_SIZES"].split(","))
max_tokens = int(os.environ["MAX_TOKENS"])
paths = os.environ["LINEAR_PATHS"].split()
temperature, seed0 = 0.7, 1234

with on_device:  # every tensor the forward pass creates lands on DEVICE
    model = DecoderModel.load(sys.argv[1])


def to_device(holder: object) -> None:
    for name, value in vars(holder).items():
        if isinstance(value, torch.Tensor):
            setattr(holder, name, value.to(device))


to_device(model)
for layer in model._layers:
    to_device(layer)
vocab = model.config.vocab_size


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(vocab) for _ in range(rng.randint(4, 40))]


def generate(prompts: list[list[int]], seeds: list[int]) -> tuple[list[tuple[list[int], list[float]]], float]:
    """Every sequence runs exactly max_tokens steps, all in one batch; returns the decode time."""
    params = [SamplingParams(temperature=temperature, seed=s, logprobs=True) for s in seeds]
    samplers = [Sampler(p, seed=s) for p, s in zip(params, seeds)]
    out: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]

    def take(rows: torch.Tensor) -> list[int]:
        rows = rows.to(cpu)
        with on_cpu:  # samplers draw from CPU generators
            picked = [s.sample(rows[i]) for i, s in enumerate(samplers)]
        for (tokens, logprobs), token in zip(out, picked):
            tokens.append(token.token_id)
            logprobs.append(token.logprob)
        return [t.token_id for t in picked]

    with on_device:
        caches = [model.new_cache() for _ in prompts]
        last = take(torch.stack([model.prefill(c, p) for c, p in zip(caches, prompts)]))
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(max_tokens - 1):
            last = take(model.decode(caches, last))
    return out, time.perf_counter() - started


failed = False
for path in paths:
    model.linear_path = path
    generate([prompt(random.Random(0))], [0])  # warm-up: one-time kernel and allocator set-up
    rng = random.Random(seed0)
    probe_prompts = [prompt(rng) for _ in range(probes)]
    alone = [generate([p], [seed0 + k])[0][0] for k, p in enumerate(probe_prompts)]
    rows, differences = [], []
    for size in sizes:
        identical, tokens, seconds = 0, 0, 0.0
        for k, p in enumerate(probe_prompts):
            fill = random.Random(seed0 * 7919 + size * 1009 + k)
            others = [prompt(fill) for _ in range(size - 1)]
            at = fill.randrange(size)
            batch = others[:at] + [p] + others[at:]
            seeds = [fill.randrange(2**31) for _ in others]
            seeds.insert(at, seed0 + k)
            replies, took = generate(batch, seeds)
            tokens += size * (max_tokens - 1)
            seconds += took
            mine = replies[at]
            if mine == alone[k]:
                identical += 1
            else:
                pairs = zip(zip(*mine), zip(*alone[k]))
                first = next((i for i, (a, b) in enumerate(pairs) if a != b), max_tokens)
                differences.append(f"{path}: probe {k} in a batch of {size} differs at token {first}")
        steps = max_tokens - 1
        rows.append(Row(
            batch_size=size,
            probes=probes,
            identical=identical,
            tokens_per_s=round(tokens / seconds, 2) if seconds > 0 else 0.0,
            tpot_ms=round(1000 * seconds / (probes * steps), 3) if steps > 0 else None,
            batch_formed=probes if size > 1 else None,
            peers_max=size - 1,
        ))
    config = ProbeConfig(url=f"in-process:{device}", probes=probes, batch_sizes=sizes,
                         max_tokens=max_tokens, temperature=temperature, seed=seed0)
    result = ProbeResult(f"in-process:{device} linear path {path}", os.path.basename(sys.argv[1]),
                         config, tuple(rows), tuple(differences))
    print(format_table(result))
    for line in differences[:5]:
        print("  " + line)
    print(json.dumps({**result.to_json(), "linear_path": path}))
    print()
    if path == paths[0] and not result.all_identical:
        failed = True
if failed:
    raise SystemExit(f"gpu_check: the {paths[0]} path is NOT batch-invariant on {device}")
print(f"gpu_check: the {paths[0]} path kept every probe bit-identical on {device}")
PY
