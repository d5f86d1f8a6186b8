"""Real library programs that run out of memory under a cap, for `bench/diagnose_cap_gpu.py`.

Random weights (nothing downloads); fixed seeds; mixed input sizes, as real jobs have. Each prints one
line `DONE items=N` at the end, so a run that completes is told from one that died.

  seg        torchvision DeepLabV3-ResNet50 inference at mixed image sizes (no_grad)
  det        torchvision Faster R-CNN v2 (ResNet-50 FPN) inference, pairs of images of mixed sizes (no_grad)
  convnext   timm ConvNeXt-Tiny inference at mixed resolutions, batch 4 (no_grad)
  hubert     transformers HuBERT-base encoder on 4-16 s of audio with autograd left on (no backward)
  trainkeep  a torch.nn Transformer classifier trained with AdamW that keeps each step's logits on the GPU

The same programs with one remedy applied by hand (issue 29: what alloctune predicts for a remedy is
checked against these): `hubert_nograd` (under torch.no_grad()), `hubert_cublas`
(CUBLAS_WORKSPACE_CONFIG=:4096:8 set before the first matmul), `seg_ec`
(torch.cuda.empty_cache() after every image), `det_ec` (the same after every batch), `convnext_bench` (torch.backends.cudnn.benchmark = True).

Usage: python bench/cap_programs.py NAME
"""

from __future__ import annotations

import contextlib
import sys

import torch


def seg(release: bool = False) -> int:
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
            if release:  # the release point alloctune simulates: the end of every repetition (x, out still held)
                torch.cuda.empty_cache()
    return len(sizes)


def det(release: bool = False) -> int:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn_v2(weights=None, weights_backbone=None,
                                                                    num_classes=91).cuda().eval()
    # pairs of (height, width): the model resizes each to a shorter side of 800 (longer at most 1333), so the
    # batch's padded shape, the proposals and the cuDNN workspaces change from batch to batch
    batches = [[(480, 640), (640, 480)], [(720, 1280), (1080, 1920)], [(600, 600), (800, 1200)],
               [(1200, 400), (500, 900)], [(768, 1024), (1024, 768)], [(360, 640), (960, 960)],
               [(1080, 1440), (640, 640)], [(400, 1200), (900, 500)]]
    with torch.no_grad():
        for pair in batches:
            images = [torch.rand(3, h, w, device="cuda") for h, w in pair]
            found = model(images)
            [{k: v.cpu() for k, v in d.items()} for d in found]
            if release:  # what a user writes at the end of the loop body (images, found still held)
                torch.cuda.empty_cache()
    return len(batches)


def convnext(benchmark: bool = False) -> int:
    import timm

    torch.backends.cudnn.benchmark = benchmark
    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny", pretrained=False).cuda().eval()
    sides = [224, 288, 384, 256, 448, 320, 512, 416, 352, 480]
    with torch.no_grad():
        for s in sides:
            x = torch.randn(4, 3, s, s, device="cuda")
            model(x).softmax(-1).cpu()
    return len(sides)


def hubert(grad: bool = True, cublas: str | None = None) -> int:
    import os

    from transformers import HubertConfig, HubertModel

    if cublas:  # read when the cuBLAS handle's workspace is first made: before the first matmul
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
    torch.manual_seed(0)
    model = HubertModel(HubertConfig()).cuda().eval()
    seconds = [4, 9, 6, 16, 12, 7, 14]
    for s in seconds:  # autograd on: activations are kept for a backward that never comes
        wav = torch.randn(1, 16000 * s, device="cuda")
        with contextlib.nullcontext() if grad else torch.no_grad():  # the hand-applied remedy: no_grad
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


PROGRAMS = {"seg": seg, "convnext": convnext, "hubert": hubert, "trainkeep": trainkeep,
            "hubert_nograd": lambda: hubert(grad=False), "hubert_cublas": lambda: hubert(cublas=":4096:8"),
            "seg_ec": lambda: seg(release=True), "det": det, "det_ec": lambda: det(release=True),
            "convnext_bench": lambda: convnext(benchmark=True)}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: python {sys.argv[0]} {{{'|'.join(PROGRAMS)}}}")
    n = PROGRAMS[sys.argv[1]]()
    torch.cuda.synchronize()
    print(f"DONE items={n}", flush=True)
