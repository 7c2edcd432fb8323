"""moelab.core.losses == transformers' load_balancing_loss_func; z-loss formula."""
import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from moelab.core.losses import load_balancing_loss, router_z_loss

torch.set_num_threads(1)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_balancing_loss_equals_transformers(top_k):
    g = torch.Generator().manual_seed(top_k)
    B, S, E = 3, 7, 6
    layers = tuple(torch.randn(B * S, E, generator=g) for _ in range(4))
    ref = load_balancing_loss_func(layers, E, top_k)
    assert torch.allclose(load_balancing_loss(layers, E, top_k), ref, atol=1e-6)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, 4:] = 0
    mask[2, 1:] = 0                                                         # padding
    ref_m = load_balancing_loss_func(layers, E, top_k, attention_mask=mask)
    ours_m = load_balancing_loss(layers, E, top_k, attention_mask=mask)
    assert torch.allclose(ours_m, ref_m, atol=1e-6)
    assert not torch.allclose(ours_m, ref, atol=1e-4)                       # the mask matters
    one = layers[0]
    assert torch.allclose(load_balancing_loss(one, E, top_k), load_balancing_loss_func((one,), E, top_k), atol=1e-6)


def test_balancing_loss_gradient_and_uniform_value():
    z = torch.zeros(10, 4, requires_grad=True)
    loss = load_balancing_loss(z, 4, 1)
    loss.backward()
    assert z.grad is not None
    # perfectly uniform probabilities: L = E * sum_e f_e / E = k (f sums to k)
    assert torch.allclose(load_balancing_loss(torch.zeros(8, 4), 4, 2), torch.tensor(2.0))


def test_z_loss_formula_and_bad_input():
    z = torch.randn(5, 3)
    assert torch.allclose(router_z_loss(z), (torch.logsumexp(z, -1) ** 2).mean())
    assert torch.allclose(router_z_loss((z, 2 * z)), (router_z_loss(z) + router_z_loss(2 * z)) / 2)
    bad = z.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        load_balancing_loss(bad, 3, 1)
    with pytest.raises(ValueError, match="top_k=4"):
        load_balancing_loss(z, 3, 4)
    with pytest.raises(ValueError, match="num_experts"):
        load_balancing_loss(z, 5, 1)
    with pytest.raises(ValueError, match="attention_mask has 4 tokens"):
        load_balancing_loss(z, 3, 1, attention_mask=torch.ones(2, 2))          # z has 5 tokens


def test_in_batch_contrastive_equals_a_loop_and_sentence_transformers_mnrl_scores():
    from sentence_transformers.util import cos_sim

    from moelab.core.losses import in_batch_contrastive

    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(4, 6, generator=g), torch.randn(7, 6, generator=g)   # 4 positives, 3 hard negatives
    loop = 0.0
    for i in range(4):
        s = [20.0 * float(torch.dot(a[i], c[j]) / (a[i].norm() * c[j].norm())) for j in range(7)]
        loop += -(s[i] - float(torch.logsumexp(torch.tensor(s), 0))) / 4
    assert float(in_batch_contrastive(a, c)) == pytest.approx(loop, rel=1e-5)
    ref = torch.nn.functional.cross_entropy(20.0 * cos_sim(a, c), torch.arange(4))  # MNRL's own similarity
    assert float(in_batch_contrastive(a, c)) == pytest.approx(float(ref), rel=1e-6)
    with pytest.raises(ValueError, match="M >= N"):
        in_batch_contrastive(a, c[:3])
