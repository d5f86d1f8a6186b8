"""The reference workloads: they run (--tiny on the CPU), report, and have the real shapes.

Parameter counts are compared with the figures measured on the real RVC classes in
rvc-workload.md (§2.2, §2.3, §5) and with the published sizes of SD-1.5's UNet, Llama-3.2-1B
and GPT-2 small; models are built on the meta device, so no memory is touched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from alloctune.workloads import WORKLOADS, chunking, common, diffusion, llm, rvc, rvc_models, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tiny runs are latency-bound; one thread avoids oversubscribing a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _meta_params(factory) -> int:
    with torch.device("meta"):
        return common.count_params(factory())


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("version", "sr", "expected"),
    [  # rvc-workload.md §2.3, "params w/o enc_q (measured)"
        ("v1", "32k", 27_471_170),
        ("v1", "40k", 27_439_042),
        ("v1", "48k", 27_479_362),
        ("v2", "32k", 28_057_538),
        ("v2", "40k", 27_537_346),
        ("v2", "48k", 28_716_994),
    ],
)
def test_synthesizer_params_match_rvc(version, sr, expected):
    with torch.device("meta"):
        synth = rvc_models.Synthesizer(rvc_models.SYNTH_CONFIGS[(version, sr)])
    assert common.count_params(synth) == expected
    assert common.count_params(synth.emb_g) == 27_904
    assert common.count_params(synth.flow) == 6_515_328  # "flow 6.52 M"
    assert round(common.count_params(synth.enc_p) / 1e6, 2) == (6.50 if version == "v2" else 6.40)


def test_rmvpe_params_match_rvc():
    assert _meta_params(rvc_models.RMVPE) == 90_423_165  # §2.2, = the released rmvpe.pt


def test_hubert_params_match_transformers_count():
    assert _meta_params(lambda: rvc_models.ContentEncoder("v2")) == 94_371_712  # §5
    # v1 keeps all 12 layers resident and adds final_proj 768→256 (196,864).
    assert _meta_params(lambda: rvc_models.ContentEncoder("v1")) == 94_371_712 + 196_864


def test_other_models_have_their_published_sizes():
    assert _meta_params(lambda: diffusion.UNet(diffusion.UNetConfig())) == 859_520_964  # SD-1.5 UNet
    from transformers import LlamaConfig, LlamaForCausalLM

    assert _meta_params(lambda: LlamaForCausalLM(LlamaConfig(**llm.FULL))) == 1_235_814_400  # Llama-3.2-1B
    assert _meta_params(lambda: train.GPT(train.GPTConfig())) == 124_439_808  # GPT-2 small


def test_hop_is_the_product_of_upsample_rates():
    hops = {key: cfg.hop for key, cfg in rvc_models.SYNTH_CONFIGS.items()}
    assert hops == {
        ("v1", "32k"): 320, ("v1", "40k"): 400, ("v1", "48k"): 480,
        ("v2", "32k"): 320, ("v2", "40k"): 400, ("v2", "48k"): 480,
    }


def test_relative_attention_reshapes_match_their_definition():
    n = 5
    attn = rvc_models.RelativeAttention(8, 2, window_size=2)
    rel = torch.arange(2 * 2 * n * (2 * n - 1), dtype=torch.float32).view(2, 2, n, 2 * n - 1)
    absolute = attn._rel_to_abs(rel)
    assert absolute.shape == (2, 2, n, n)
    for i in range(n):
        for j in range(n):  # absolute (i, j) reads relative offset j - i
            assert torch.equal(absolute[..., i, j], rel[..., i, j - i + n - 1])
    back = attn._abs_to_rel(absolute)
    assert back.shape == (2, 2, n, 2 * n - 1)
    for i in range(n):
        for r in range(2 * n - 1):
            j = i + r - (n - 1)
            expected = absolute[..., i, j] if 0 <= j < n else torch.zeros(2, 2)
            assert torch.equal(back[..., i, r], expected)


def test_synthesizer_output_is_frames_times_hop():
    base = rvc_models.SYNTH_CONFIGS[("v2", "40k")]
    cfg = dataclasses.replace(base, **rvc_models.TINY_SYNTH, content_channels=12)
    assert cfg.hop == 32 and cfg.sr == 3200
    synth = rvc_models.Synthesizer(cfg).eval()
    t = 30
    out = synth.infer(
        torch.randn(1, t, 12), torch.tensor([t]), torch.randint(1, 256, (1, t)),
        torch.rand(1, t) * 300, torch.tensor([0]),
    )
    assert out.shape == (1, 1, t * 32)


def test_decode_f0_and_coarse_pitch():
    salience = np.zeros((3, 360), dtype=np.float32)
    salience[0, 100] = 0.9  # one-hot at bin 100 → exactly that bin's cents
    salience[1, 5] = 0.02  # below the 0.03 threshold → unvoiced
    salience[2, :] = np.nan  # fp16 overflow must not become a pitch index
    f0 = rvc.decode_f0(salience)
    assert f0[0] == pytest.approx(10 * 2 ** ((20 * 100 + 1997.3794084376191) / 1200))
    assert f0[1] == 0 and f0[2] == 0
    coarse = rvc.coarse_pitch(np.array([0.0, 50.0, 1100.0, 5000.0]))
    assert coarse.tolist() == [1, 1, 255, 255]


def test_materialize_stages_through_fp32_and_fills_sane_values():
    cfg = dataclasses.replace(rvc_models.SYNTH_CONFIGS[("v2", "40k")], **rvc_models.TINY_SYNTH)
    synth = common.materialize(lambda: rvc_models.Synthesizer(cfg), torch.device("cpu"), torch.float16,
                               stage_dtype=torch.float32)
    params = dict(synth.named_parameters())
    assert all(p.dtype == torch.float16 and p.device.type == "cpu" for p in params.values())
    assert all(torch.isfinite(p).all() for p in params.values())
    assert torch.all(params["dec.ups.0.weight_g"] == 1)  # weight-norm magnitudes
    assert torch.all(params["enc_p.encoder.norm_layers_1.0.gamma"] == 1) and torch.all(params["enc_p.proj.bias"] == 0)
    v = params["dec.ups.0.weight_v"].detach().float()
    assert 0.5 < float(v.std() * v[0].numel() ** 0.5) < 2.0  # N(0, 1/fan_in)
    rmvpe = common.materialize(lambda: rvc_models.RMVPE(base=4, n_mels=32, gru_hidden=8), torch.device("cpu"),
                               torch.float32)
    bn = rmvpe.unet.encoder.bn
    assert torch.all(bn.running_var == 1) and torch.all(bn.running_mean == 0) and torch.all(bn.weight == 1)


def test_full_size_models_run_on_meta():
    """Full-size forward passes on the meta device: the real shapes fit together, no memory used."""
    with torch.device("meta"):
        unet = diffusion.UNet(diffusion.UNetConfig())
        assert unet(torch.empty(2, 4, 128, 72), torch.tensor([999]), torch.empty(2, 77, 768)).shape == (2, 4, 128, 72)
        assert diffusion.VAEDecoder(diffusion.VAEConfig())(torch.empty(1, 4, 128, 72)).shape == (1, 3, 1024, 576)
        for (version, sr), cfg in rvc_models.SYNTH_CONFIGS.items():
            t = 50
            out = rvc_models.Synthesizer(cfg).infer(
                torch.empty(1, t, cfg.content_dim), torch.tensor([t]), torch.zeros(1, t, dtype=torch.long),
                torch.empty(1, t), torch.zeros(1, dtype=torch.long),
            )
            assert out.shape == (1, 1, t * cfg.sr // 100), (version, sr)
        assert rvc_models.RMVPE()(torch.empty(1, 128, 64)).shape == (1, 64, 360)


# ----------------------------------------------------------------------------- draws


def _ctx(count: int, seed: int = 0, tiny: bool = False) -> common.RunContext:
    return common.RunContext(
        name="t", device=torch.device("cpu"), dtype=torch.float32, tiny=tiny, seed=seed, count=count,
        rng=np.random.default_rng(seed),
    )


def test_llm_requests_cover_the_brief_ranges():
    reqs = llm.draw_requests(_ctx(400), 64, 6000, 4, (16, 64))
    prompts = [r.prompt for r in reqs]
    assert min(prompts) >= 64 and max(prompts) <= 6000
    assert min(prompts) < 100 and max(prompts) > 3000  # log-uniform reaches both ends
    assert {r.batch for r in reqs} == {1, 2, 3, 4}
    assert min(r.new_tokens for r in reqs) >= 16 and max(r.new_tokens for r in reqs) <= 64
    assert reqs == llm.draw_requests(_ctx(400), 64, 6000, 4, (16, 64))  # seeded


def test_train_shapes_respect_the_token_budget():
    shapes = train.draw_shapes(_ctx(300), context=1024, max_tokens=8192)
    assert all(64 <= seq <= 1024 and 1 <= b <= 16 and b * seq <= max(8192, seq) for b, seq in shapes)
    assert len({seq for _, seq in shapes}) > 100  # lengths really vary


# ----------------------------------------------------------------------------- runs


@pytest.mark.slow  # a fresh interpreter importing torch (and transformers): ~3-10 s each
@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_runs_tiny_on_cpu_as_a_module(name):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", f"alloctune.workloads.{name}", "--tiny", "--device", "cpu", "--seed", "1"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["workload"] == name and summary["outcome"] == "ok"
    assert summary["items"] == len([ln for ln in lines if ln.startswith(f"[{name}] item ")]) >= 2
    assert summary["device"] == "cpu" and summary["tiny"] is True
    assert summary["peak_allocated"] is None  # memory figures only on CUDA
    assert "items/s" in lines[-2]


def test_rvc_in_process_cuts_and_reassembles():
    summary = rvc.main(["--tiny", "--device", "cpu", "--quiet", "--count", "3", "--seed", "0"])
    assert summary.outcome == "ok" and summary.items == 3
    ctx = _ctx(3, seed=0, tiny=True)
    lengths = [round(float(np.exp(ctx.rng.uniform(np.log(1.0), np.log(5.0)))), 3) for _ in range(3)]
    assert summary.totals["audio_s"] == pytest.approx(
        sum(int(s * chunking.SAMPLE_RATE) / chunking.SAMPLE_RATE for s in lengths)
    )
    assert summary.totals["chunks"] > summary.items  # the tiny preset cuts files over 2.49 s


def test_rvc_v1_with_index_step_in_process():
    summary = rvc.main(["--tiny", "--device", "cpu", "--quiet", "--count", "1", "--version", "v1", "--sr", "48k",
                        "--index-rate", "0.75", "--min-seconds", "3", "--max-seconds", "3"])
    assert summary.items == 1 and summary.totals["chunks"] == 2  # 3 s > 2.49 s: one cut near 2 s


@pytest.mark.parametrize(("module", "key"), [(diffusion, "megapixels"), (llm, "new_tokens"), (train, "tokens")])
def test_other_workloads_in_process(module, key):
    summary = module.main(["--tiny", "--device", "cpu", "--quiet", "--count", "2"])
    assert summary.outcome == "ok" and summary.items == 2 and summary.totals[key] > 0
    assert summary.items_per_s > 0 and summary.wall_s >= summary.items_wall_s


def test_same_seed_same_inputs():
    a = diffusion.build(_ctx(8, seed=5, tiny=True), diffusion_args := _parse(diffusion, ["--tiny"]))
    b = diffusion.build(_ctx(8, seed=5, tiny=True), diffusion_args)
    assert a.resolutions == b.resolutions and len(set(a.resolutions)) > 1


def _parse(module, argv):
    parser = common.base_parser(module.NAME, None, 1, 1)
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        train.main(["--tiny", "--device", "cuda"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0]


def test_bad_count_is_rejected(capsys):
    with pytest.raises(SystemExit) as exc:
        llm.main(["--tiny", "--device", "cpu", "--count", "0"])
    assert exc.value.code == 2
    assert "--count must be at least 1" in capsys.readouterr().err


def test_summary_round_trips():
    summary = train.main(["--tiny", "--device", "cpu", "--quiet", "--count", "1"])
    assert common.Summary.from_dict(json.loads(json.dumps(summary.to_dict()))) == summary


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_report_memory_on_cuda(name):
    module = {"rvc": rvc, "diffusion": diffusion, "llm": llm, "train": train}[name]
    summary = module.main(["--tiny", "--device", "cuda", "--quiet", "--count", "2"])
    assert summary.peak_reserved >= summary.peak_allocated > 0
    assert 0 < summary.utilization <= 1
