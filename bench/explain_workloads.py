"""Record three programs of real library code on a CUDA machine, with Python stacks, and write
next to each snapshot the facts the process measured itself (for `tests/test_explain_gpu.py`).

Nothing is downloaded: models are built from configs with random weights. Each program runs in a
fresh child process (so its recording starts at an empty allocator) and writes
`$OUT/NAME.pickle` (torch.cuda.memory._dump_snapshot) and `$OUT/NAME.facts.json`:

* `train_leak` / `train_clean`: a torch.nn MLP trained with AdamW; the leak keeps each step's
  logits on the GPU in a list (appended right after the forward, for metrics); the clean twin
  keeps only `.item()` of the loss. Facts: `param_bytes` (unique parameter and buffer storages,
  each rounded up to 512 B), `optimizer_bytes` (AdamW's state storages on the GPU, same rule),
  `kept_bytes_per_step` and `kept_bytes` (what the list really holds at the end), `kept_line`
  (the user line that allocates the kept tensor: explain's site), `steps`.
* `convnext_leak` / `convnext_clean`: a timm ConvNeXt (torchvision's when timm lacks it) run in
  inference, the leak keeping each batch's feature maps in a Python list.
* `llama_generate`: a small Llama-config transformers model `generate`-ing from random prompts.

    python bench/explain_workloads.py --out "$OUT"            # all programs, < 3 min on an H200
    python bench/explain_workloads.py --out DIR --program train_leak
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROGRAMS = ("train_leak", "train_clean", "convnext_leak", "convnext_clean", "llama_generate")
DEVICE = "cuda"  # --device cpu --smoke runs the program bodies without recording (a check of the script itself)
SMOKE = False


def _round512(n: int) -> int:
    return (n + 511) // 512 * 512


def _storage_bytes(tensors) -> int:
    """Unique storages on the GPU, each rounded up to 512 B (what the allocator hands out)."""
    seen = {}
    for t in tensors:
        if t is None or t.device.type != DEVICE:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(_round512(n) for n in seen.values())


def _model_bytes(model) -> int:
    return _storage_bytes(list(model.parameters()) + list(model.buffers()))


def _line_of(marker: str) -> int:
    """The line number of the source line containing `marker` in this file (the kept line)."""
    for i, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if marker in line and "_line_of" not in line:
            return i
    return -1


def train(keep: bool, steps: int = 30) -> dict:
    import torch
    from torch import nn

    torch.manual_seed(0)
    dev = DEVICE
    steps = 3 if SMOKE else steps
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.LayerNorm(4096), nn.Linear(4096, 4096), nn.GELU(),
                          nn.Linear(4096, 8192)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []
    held: list[int] = []  # bytes the list holds after each step
    per_step = 0
    for step in range(steps):
        x = torch.randn(64, 1024, device=dev)
        y = torch.randint(0, 8192, (64,), device=dev)
        opt.zero_grad(set_to_none=True)
        logits = model(x)  # KEPT-LINE: allocates the tensor the leak keeps
        if keep:
            kept.append(logits.detach())  # the leak (a view: the storage was allocated on the line above)
            per_step = logits.untyped_storage().nbytes()
            held.append(_storage_bytes(kept))
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        loss.item()
        del logits, loss
    _sync()
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"param_bytes": _model_bytes(model), "optimizer_bytes": _storage_bytes(state),
            "kept_bytes": _storage_bytes(kept), "kept_bytes_per_step": per_step, "kept_after_step": held, "steps": steps,
            "kept_line": _line_of("# KEPT-LINE") if keep else None}


def convnext(keep: bool, steps: int = 24) -> dict:
    import torch

    torch.manual_seed(0)
    try:
        import timm

        model = timm.create_model("convnext_atto", pretrained=False)
        maker = "timm convnext_atto"
    except Exception:  # noqa: BLE001 - timm missing or without ConvNeXt: torchvision's
        import torchvision

        model = torchvision.models.convnext_tiny(weights=None)
        maker = "torchvision convnext_tiny"
    model = model.to(DEVICE).eval()
    steps = 2 if SMOKE else steps
    feats = []
    held: list[int] = []
    per_step = 0
    with torch.no_grad():
        for step in range(steps):
            x = torch.randn(2 if SMOKE else 16, 3, 224, 224, device=DEVICE)
            f = model.forward_features(x) if hasattr(model, "forward_features") else model.features(x)  # KEPT-FEATURES
            if keep:
                feats.append(f)  # the leak
                per_step = f.untyped_storage().nbytes()
                held.append(_storage_bytes(feats))
            del f, x
    _sync()
    return {"model": maker, "param_bytes": _model_bytes(model), "optimizer_bytes": 0,
            "kept_bytes": _storage_bytes(feats), "kept_bytes_per_step": per_step, "kept_after_step": held,
            "steps": steps,
            "kept_line": _line_of("# KEPT-FEATURES") if keep else None}


def llama() -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
    if SMOKE:
        cfg.num_hidden_layers = 2
    dtype = torch.float16 if DEVICE == "cuda" else torch.float32
    model = LlamaForCausalLM(cfg).to(device=DEVICE, dtype=dtype).eval()
    with torch.no_grad():
        for n in ((16,) if SMOKE else (128, 512, 1024)):
            ids = torch.randint(0, 32000, (2, n), device=DEVICE)
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4 if SMOKE else 32,
                           do_sample=False, pad_token_id=0)
    _sync()
    return {"param_bytes": _model_bytes(model), "optimizer_bytes": 0, "kept_bytes": 0, "kept_bytes_per_step": 0}


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def run_one(name: str, out: Path) -> None:
    import torch

    record = DEVICE == "cuda"
    if record:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    t = time.time()
    facts = {"train_leak": lambda: train(True), "train_clean": lambda: train(False),
             "convnext_leak": lambda: convnext(True), "convnext_clean": lambda: convnext(False),
             "llama_generate": llama}[name]()
    facts.update(program=name, wall_s=round(time.time() - t, 2), torch=torch.__version__, file=__file__)
    if record:
        torch.cuda.memory._dump_snapshot(str(out / f"{name}.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
    (out / f"{name}.facts.json").write_text(json.dumps(facts, indent=1))


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "explain_workloads"))
    ap.add_argument("--program", choices=PROGRAMS)
    ap.add_argument("--device", default="cuda", help="cpu: run the bodies without recording (with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: a check that the script runs")
    args = ap.parse_args()
    global DEVICE, SMOKE
    DEVICE, SMOKE = args.device, args.smoke
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.program:
        run_one(args.program, out)
        return
    for name in PROGRAMS:  # a fresh process each: every recording starts at an empty allocator
        t = time.time()
        extra = ["--device", DEVICE] + (["--smoke"] if SMOKE else [])
        if name.startswith("convnext") and DEVICE != "cuda" and not _has("timm") and not _has("torchvision"):
            print(f"{name}: skipped (neither timm nor torchvision here)")
            continue
        subprocess.run([sys.executable, __file__, "--out", str(out), "--program", name, *extra], check=True)
        print(f"{name}: {time.time() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
