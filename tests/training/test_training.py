from __future__ import annotations

import math

import pytest
import torch
from conftest import train_cfg

from tuner.data.tokens import TokenizedTexts
from tuner.errors import TrialFailed
from tuner.models.base import NewLayer
from tuner.training import batch_loss, evaluate, initialise_new_layers, mixup, train


def _separable_data(n: int = 64) -> TokenizedTexts:
    """Label 1 texts use tokens 50-99, label 0 texts tokens 1-49: learnable in a few steps."""
    generator = torch.Generator().manual_seed(1)
    labels = torch.arange(n) % 2
    ids = torch.randint(1, 50, (n, 10), generator=generator) + 49 * labels.unsqueeze(1)
    return TokenizedTexts(ids, torch.ones(n, 10, dtype=torch.long), labels)


def _train_text(model, data, cfg, **callbacks):
    return train(model, data, data, cfg, batch_loss("text", cfg, 2), **callbacks)


def test_training_learns_and_reports_every_epoch(tiny_bert):
    data = _separable_data()
    epochs = []
    result = _train_text(tiny_bert, data, train_cfg(epochs=3), on_epoch=epochs.append)
    assert [e.epoch for e in epochs] == [1, 2, 3]
    assert epochs[-1].train_loss < epochs[0].train_loss
    assert result.val_accuracy == evaluate(tiny_bert, data) > 0.9
    # The final validation logits are kept for deployment's comparisons.
    assert result.val_logits.shape == (64, 2)
    assert torch.allclose(result.val_logits, tiny_bert(data.input_ids, data.attention_mask))


def test_mixup_and_clipping_train_too(tiny_bert):
    data = _separable_data()
    result = _train_text(tiny_bert, data, train_cfg(mixup_alpha=0.2, grad_clip_norm=5.0))
    assert all(math.isfinite(e.train_loss) for e in result.epochs)


def test_diverging_loss_fails_the_trial_with_the_reason(tiny_bert):
    data = _separable_data()
    with pytest.raises(TrialFailed, match=r"train_loss became (nan|inf) at epoch 1, step \d+"):
        _train_text(tiny_bert, data, train_cfg(lr=1e30))


def test_mixup_mixes_representations_and_labels_alike():
    pooled = torch.randn(6, 4)
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    mixed = mixup(pooled, labels, alpha=0.4, generator=torch.Generator().manual_seed(3))
    assert 0 < mixed.lam < 1
    assert sorted(mixed.partner.tolist()) == list(range(6))
    expected = mixed.lam * pooled + (1 - mixed.lam) * pooled[mixed.partner]
    assert torch.allclose(mixed.pooled, expected)
    assert torch.equal(mixed.labels_a, labels)
    assert torch.equal(mixed.labels_b, labels[mixed.partner])
    # The loss interpolates the two cross-entropies with the same lam.
    logits = torch.randn(6, 2)
    ce = torch.nn.functional.cross_entropy
    expected_loss = mixed.lam * ce(logits, labels) + (1 - mixed.lam) * ce(
        logits, labels[mixed.partner]
    )
    assert torch.allclose(mixed.loss(logits), expected_loss)


def test_mixup_is_reproducible():
    pooled, labels = torch.randn(8, 3), torch.arange(8) % 2
    a = mixup(pooled, labels, 0.2, torch.Generator().manual_seed(5))
    b = mixup(pooled, labels, 0.2, torch.Generator().manual_seed(5))
    assert a.lam == b.lam and torch.equal(a.pooled, b.pooled)


@pytest.mark.parametrize(
    ("scheme", "activation", "expected_std"),
    [
        # Kaiming normal, fan_in 400: std = gain / sqrt(fan_in), ReLU gain sqrt(2).
        ("kaiming", "gelu", math.sqrt(2 / 400)),
        ("auto", "gelu", math.sqrt(2 / 400)),
        # Xavier uniform, fans 400 and 300: std = gain * sqrt(2 / (fan_in + fan_out)).
        ("xavier", "linear", math.sqrt(2 / 700)),
        ("auto", "linear", math.sqrt(2 / 700)),
        ("auto", "tanh", 5 / 3 * math.sqrt(2 / 700)),
    ],
)
def test_init_schemes_follow_the_activation(scheme, activation, expected_std):
    torch.manual_seed(0)
    layer = torch.nn.Linear(400, 300)
    initialise_new_layers([NewLayer("x", layer, activation)], scheme)
    assert layer.weight.std().item() == pytest.approx(expected_std, rel=0.05)
    assert torch.count_nonzero(layer.bias) == 0


def test_auto_init_covers_head_and_new_encoder(tiny_bert):
    layers = {layer.name: layer.activation for layer in tiny_bert.new_layers()}
    assert layers["head.dense"] == "gelu"
    assert layers["head.out"] == "linear"
    assert layers["encoder.encoder.layer.0.intermediate.dense"] == "gelu"
    assert layers["encoder.encoder.layer.0.output.dense"] == "linear"


def test_logits_come_back_in_data_order_when_batches_are_grouped(tiny_bert):
    """Validation batches texts sorted by length; each example's logits must still be its own,
    as the model gives them for that text alone."""
    from tuner.training import collect_logits

    lengths = [5, 1, 8, 3, 2, 7, 4, 6, 8, 1]
    mask = torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])
    ids = torch.randint(1, 90, (len(lengths), 8), generator=torch.Generator().manual_seed(0))
    data = TokenizedTexts(ids * mask, mask, torch.zeros(len(lengths), dtype=torch.long))
    tiny_bert.eval()
    logits = collect_logits(tiny_bert, data, batch_size=3)
    with torch.inference_mode():
        alone = torch.cat(
            [tiny_bert(ids[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(lengths)]
        )
    assert torch.allclose(logits, alone, atol=1e-5)
