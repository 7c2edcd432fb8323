"""The synthetic trainer of notebook 04 on a device (moelab.mass.experiment): ``device="auto"`` resolves to CUDA
when present; the CPU path equals a plain Adam loop (the path every committed CPU number came from); a tiny run on
CUDA (bf16 autocast) is finite and close to the CPU run (skipped without a GPU)."""
import numpy as np
import pytest
import torch

from moelab.mass import (StackedMoETransformer, SynthSetup, _nll, lr_factor, resolve_device, run_mass, run_naive,
                         mass_config, train_stacked)


def _setup(**kw):
    base = dict(d_model=8, n_heads=2, batch_size=4, steps=12, max_experts=4, n_test=8, data_format="incontext",
                n_examples=2, example_len=3, n_entities=3, n_properties=3, n_symbols=6)
    return SynthSetup(**{**base, **kw})


def test_resolve_device():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="must be one of"):
        SynthSetup(device="gpu")
    assert _setup().key()["device"] == _setup().torch_device


def _plain_loop(model, docs, mask, steps, batch_size, lr, seed, decay):
    """The CPU training step written out: same batch draws, masked CE summed over models, Adam, warm-up schedule."""
    rng = np.random.default_rng(seed)
    docs_t, mask_t = torch.as_tensor(docs), torch.as_tensor(mask)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    warm = max(1, int(0.05 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, warm, decay))
    losses = []
    for _ in range(steps):
        i = rng.integers(0, len(docs_t), batch_size)
        per = _nll(model(docs_t[i][:, :-1]), docs_t[i], mask_t[i]).mean(1)
        opt.zero_grad()
        per.sum().backward()
        opt.step()
        sched.step()
        losses.append(per.detach())
    return torch.stack(losses)


def test_cpu_path_equals_plain_loop():
    s = _setup(loss_on="targets", lr_decay="cosine")
    g, train, _ = s.data()
    tok, mask = s.arrays(train)
    mk = lambda: StackedMoETransformer(2, s.n_symbols, s.d_model, s.n_heads, s.input_len, 4, num_experts=[2, 4],
                                       top_k=[1, 2], seeds=[3, 4])
    a, b = mk(), mk()
    hist = train_stacked(a, tok, steps=s.steps, batch_size=s.batch_size, lr=s.lr, seed=1, loss_mask=mask,
                         decay="cosine", log_every=1, device="cpu", progress_bar=False)
    ref = _plain_loop(b, tok, mask, s.steps, s.batch_size, s.lr, 1, "cosine")
    np.testing.assert_allclose(hist.sort_values(["step", "model"]).loss.to_numpy(), ref.numpy().reshape(-1),
                               rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


def test_auto_equals_cpu_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("auto resolves to CUDA here")
    a = run_naive(_setup(device="auto"), [(2, 1, 0), (3, 2, 1)])["table"]
    b = run_naive(_setup(device="cpu"), [(2, 1, 0), (3, 2, 1)])["table"]
    np.testing.assert_allclose(a.test_loss, b.test_loss, rtol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tiny_synthetic_training():
    """Naive and MASS runs on CUDA under bf16 autocast: finite, the model lives on the GPU, close to the CPU run."""
    s_gpu, s_cpu = _setup(device="cuda", steps=40), _setup(device="cpu", steps=40)
    gpu = run_naive(s_gpu, [(2, 1, 0), (4, 2, 0)])["table"]
    cpu = run_naive(s_cpu, [(2, 1, 0), (4, 2, 0)])["table"]
    assert np.isfinite(gpu.test_loss).all()
    np.testing.assert_allclose(gpu.test_loss, cpu.test_loss, atol=0.15)
    m = run_mass(s_gpu, mass_config(s_gpu, 2), [0, 1])
    assert np.isfinite(m["table"].test_loss).all() and (m["table"].final_experts >= 1).all()
