"""The RVC replica's memory per stage against the figures measured on RVC's own classes.

rvc-workload.md §3 measured, on a CPU in fp32, the peak bytes of operator outputs alive at
once (parameters and inputs excluded) for each stage and fitted them over T. The same
measurement on the replica must give the same curves: that is what "faithful shapes and
allocation order" means for the allocator. `LiveBytes` below is that tracker.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from alloctune.workloads import common, rvc, rvc_models

CPU = torch.device("cpu")


class LiveBytes(TorchDispatchMode):
    """Peak bytes of op outputs alive at once (a storage counts until its last tensor dies).

    `events` lists every ("alloc", bytes) and ("free", bytes) in order: the allocation
    sequence a caching allocator would see from this code, minus device-specific workspaces.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.events: list[tuple[str, int]] = []
        self._refs: dict[int, int] = {}
        self._size: dict[int, int] = {}

    def _release(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            size = self._size.pop(key)
            self.live -= size
            self.events.append(("free", size))
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0:
                continue
            if key not in self._refs:
                self._refs[key] = 0
                self._size[key] = size
                self.events.append(("alloc", size))
                self.live += size
                self.peak = max(self.peak, self.live)
            self._refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out


def _track(fn, *args) -> LiveBytes:
    tracker = LiveBytes()
    with torch.no_grad(), tracker:
        fn(*args)
    return tracker


def _peak(fn, *args) -> int:
    return _track(fn, *args).peak


@pytest.fixture(scope="module")
def synth():
    torch.manual_seed(0)
    cfg = rvc_models.SYNTH_CONFIGS[("v2", "40k")]
    return common.materialize(lambda: rvc_models.Synthesizer(cfg).eval(), CPU, torch.float32)


def _inputs(t: int):
    return (torch.randn(1, t, 768), torch.randint(1, 255, (1, t)), torch.tensor([t]))


def test_text_encoder_is_quadratic_like_rvcs(synth):
    for t in (200, 400):
        phone, pitch, lengths = _inputs(t)
        measured = _peak(synth.enc_p, phone, pitch, lengths)
        assert measured == pytest.approx(84 * t * t + 6900 * t, rel=0.05), t  # §3: 84·T² + 6.9 kB·T


def test_flow_matches_rvc(synth):
    for t in (200, 400):
        z = torch.randn(1, 192, t)
        mask = torch.ones(1, 1, t)
        g = torch.randn(1, 256, 1)
        measured = _peak(synth.flow.reverse, z, mask, g)
        assert measured == pytest.approx(12_300 * t + 25e6, rel=0.05), t  # §3: 12.3 kB·T + 25 MB


@pytest.mark.slow  # two decoder passes producing 40k and 120k samples through 12 res blocks
def test_decoder_grows_like_rvcs(synth):
    g = torch.randn(1, 256, 1)
    peaks = {}
    for t in (100, 300):
        peaks[t] = _peak(synth.dec, torch.randn(1, 192, t), torch.rand(1, t) * 300, g)
    slope = (peaks[300] - peaks[100]) / 200
    assert slope == pytest.approx(313e3, rel=0.03)  # §3, dec v2-40k fp32: 313 kB·T (+ 80 MB)
    # The constant comes out ~54 MB (mostly the ~57 MB of weight-norm weights recomputed per
    # call), below the 80 MB of §3's fit; RVC's own class gives the same 54 MB (see the
    # sequence test below), so only a loose bound is asserted here.
    assert 40e6 < peaks[100] - 100 * slope < 90e6


def test_rmvpe_and_its_mel_per_frame():
    torch.manual_seed(0)
    model = common.materialize(lambda: rvc_models.RMVPE().eval(), CPU, torch.float32)
    front = rvc_models.MelFrontEnd()
    with torch.no_grad():
        front(torch.randn(1, 16_000), torch.float32)  # the Hann window is made once, on the first call
    mel_peaks = {f: _peak(front, torch.randn(1, (f - 1) * 160), torch.float32) for f in (256, 512)}
    assert (mel_peaks[512] - mel_peaks[256]) / 256 == pytest.approx(10.3e3, rel=0.02)  # §3: 10.3 kB/frame
    unet_peaks = {}
    for frames in (64, 128):
        with torch.no_grad():
            mel = front(torch.randn(1, (frames - 1) * 160), torch.float32)
        assert mel.shape == (1, 128, frames)
        unet_peaks[frames] = _peak(rvc._mel_to_salience, model, mel)
    assert (unet_peaks[128] - unet_peaks[64]) / 64 == pytest.approx(61.2e3, rel=0.02)  # §3: 61.2 kB/frame


def test_hubert_stem_per_sample():
    torch.manual_seed(0)
    hubert = common.materialize(lambda: rvc_models.ContentEncoder("v2").eval(), CPU, torch.float32)
    stem = hubert.model.feature_extractor
    peaks = {n: _peak(stem, torch.randn(1, n)) for n in (16_000, 32_000)}
    assert (peaks[32_000] - peaks[16_000]) / 16_000 == pytest.approx(819, rel=0.02)  # §3: 819 B/sample


def test_allocation_sequence_matches_rvcs_own_classes(synth):
    """Event-for-event against RVC's classes, when the `rvc` package (RVC-Project's packaging
    of tag 2.2.231006) is importable; it is not a dependency (it needs scipy, librosa and,
    for HuBERT, fairseq). Its SineGen is the 2023 variant while the replica follows 2024's,
    so the decoder is compared with the sine source stubbed out on both sides."""
    models = pytest.importorskip("rvc.lib.infer_pack.models", reason="the `rvc` package is not installed")
    rmvpe_mod = pytest.importorskip("rvc.lib.rmvpe", reason="the `rvc` package is not installed")
    torch.manual_seed(0)
    theirs = models.SynthesizerTrnMs768NSFsid(
        1025, 32, 192, 192, 768, 2, 6, 3, 0, "1", [3, 7, 11], [[1, 3, 5]] * 3, [10, 10, 2, 2], 512,
        [16, 16, 4, 4], 109, 256, 40000, is_half=False,
    ).eval()
    del theirs.enc_q
    assert common.count_params(theirs) == common.count_params(synth)
    t = 120
    phone, pitch, lengths = _inputs(t)
    a = _track(theirs.enc_p, phone, pitch, lengths).events
    assert a == _track(synth.enc_p, phone, pitch, lengths).events
    z, mask, g = torch.randn(1, 192, t), torch.ones(1, 1, t), torch.randn(1, 256, 1)
    assert _track(lambda: theirs.flow(z, mask, g=g, reverse=True)).events == _track(synth.flow.reverse, z, mask, g).events

    class TheirSource(torch.nn.Module):
        def forward(self, f0, upp):
            return torch.zeros(1, f0.shape[1] * upp, 1), None, None

    class OurSource(torch.nn.Module):
        def forward(self, f0, upp):
            return torch.zeros(1, f0.shape[1] * upp, 1)

    theirs.dec.m_source, ours_source = TheirSource(), synth.dec.m_source
    synth.dec.m_source = OurSource()
    try:
        f0 = torch.rand(1, t) * 300
        assert _track(lambda: theirs.dec(z, f0, g=g)).events == _track(synth.dec, z, f0, g).events
    finally:
        synth.dec.m_source = ours_source

    e2e = rmvpe_mod.E2E(4, 1, (2, 2)).eval()
    ours = common.materialize(lambda: rvc_models.RMVPE().eval(), CPU, torch.float32)
    assert common.count_params(e2e) == common.count_params(ours)
    mel = torch.randn(1, 128, 100)
    padded = torch.nn.functional.pad(mel, (0, 28))
    assert _track(lambda: e2e(padded)).events == _track(ours, padded).events
