from __future__ import annotations

import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from tuner.config.compose import CONF_DIR
from tuner.edits.ffn_width import find_feed_forwards
from tuner.models import build_model, resolve_name_or_path


def test_packaged_minilm_loads_and_runs():
    model_cfg = OmegaConf.load(CONF_DIR / "model" / "minilm.yaml")
    model = build_model(model_cfg, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(resolve_name_or_path(model_cfg.name_or_path))
    texts = ["a gorgeous, moving film", "a beautiful and touching movie", "stocks fell today"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        pooled = model.embed(batch["input_ids"], batch["attention_mask"])
        logits = model(batch["input_ids"], batch["attention_mask"])
    config = model.encoder.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("bert", 6, 384)
    assert [block.width for block in find_feed_forwards(model)] == [1536] * 6
    assert pooled.shape == (3, 384) and logits.shape == (3, 2)
    assert torch.isfinite(logits).all()
    # Pretrained sentence embeddings: two reviews of a film are closer than film and finance.
    similarity = torch.nn.functional.cosine_similarity
    assert similarity(pooled[0], pooled[1], dim=0) > similarity(pooled[0], pooled[2], dim=0) + 0.2
