"""Real library programs that run out of memory under a cap, for `bench/diagnose_cap_gpu.py`.

Random weights (nothing downloads); fixed seeds; mixed input sizes, as real jobs have. Each prints one
line `DONE items=N` at the end, so a run that completes is told from one that died.

  seg        torchvision DeepLabV3-ResNet50 inference at mixed image sizes (no_grad)
  convnext   timm ConvNeXt-Tiny inference at mixed resolutions, batch 4 (no_grad)
  hubert     transformers HuBERT-base encoder on 4-16 s of audio with autograd left on (no backward)
  trainkeep  a torch.nn Transformer classifier trained with AdamW that keeps each step's logits on the GPU

Remedies applied by hand (#29: the truth `tune`'s and `explain`'s remedies are checked against):

  hubert_nograd  hubert with the line tune offers added: torch.inference_mode() around the forward calls
  seg_ec         seg calling gc.collect() + torch.cuda.empty_cache() after every image

Usage: python bench/cap_programs.py NAME
"""

from __future__ import annotations

import sys

import torch


def seg() -> int:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None,
                                                               num_classes=21).cuda().eval()
    sizes = [(512, 512), (640, 480), (896, 896), (480, 640), (768, 1024), (1024, 768), (720, 1280), (960, 960)]
    with torch.no_grad():
        for h, w in sizes:
            x = torch.randn(2, 3, h, w, device="cuda")
            out = model(x)["out"]
            out.argmax(1).cpu()
    return len(sizes)


def convnext() -> int:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny", pretrained=False).cuda().eval()
    sides = [224, 288, 384, 256, 448, 320, 512, 416, 352, 480]
    with torch.no_grad():
        for s in sides:
            x = torch.randn(4, 3, s, s, device="cuda")
            model(x).softmax(-1).cpu()
    return len(sides)


def hubert() -> int:
    from transformers import HubertConfig, HubertModel

    torch.manual_seed(0)
    model = HubertModel(HubertConfig()).cuda().eval()
    seconds = [4, 9, 6, 16, 12, 7, 14]
    for s in seconds:  # autograd on: activations are kept for a backward that never comes
        wav = torch.randn(1, 16000 * s, device="cuda")
        model(wav).last_hidden_state.mean().item()
    return len(seconds)


def trainkeep() -> int:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(8000, 512), torch.nn.TransformerEncoder(layer, 4),
                                torch.nn.Linear(512, 8000)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []  # logits kept "for metrics": the leak
    steps = 24
    for step in range(steps):
        seq = 128 + 32 * (step % 5)
        x = torch.randint(0, 8000, (8, seq), device="cuda")
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 8000), x.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        kept.append(logits.detach())
    return steps


def hubert_nograd() -> int:
    with torch.inference_mode():
        return hubert()


def seg_ec() -> int:
    import gc

    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None,
                                                               num_classes=21).cuda().eval()
    sizes = [(512, 512), (640, 480), (896, 896), (480, 640), (768, 1024), (1024, 768), (720, 1280), (960, 960)]
    with torch.no_grad():
        for h, w in sizes:
            x = torch.randn(2, 3, h, w, device="cuda")
            out = model(x)["out"]
            out.argmax(1).cpu()
            del x, out
            gc.collect()
            torch.cuda.empty_cache()
    return len(sizes)


PROGRAMS = {"seg": seg, "convnext": convnext, "hubert": hubert, "trainkeep": trainkeep,
            "hubert_nograd": hubert_nograd, "seg_ec": seg_ec}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: python {sys.argv[0]} {{{'|'.join(PROGRAMS)}}}")
    n = PROGRAMS[sys.argv[1]]()
    torch.cuda.synchronize()
    print(f"DONE items={n}", flush=True)
