"""The cross-encoder's pair state: [CLS] or the masked mean of the token states, and the CPU scale's choice."""

import pytest
import torch
from transformers import BertConfig, BertModel

from fedrepro.config import parse_params
from fedrepro.models.backbone import load_tokenizer
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.fedmatch.runs import build_model_factory
from test_config import with_change


def test_mean_pooling_is_the_masked_mean_and_ignores_padding():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = CrossEncoder(BertModel(config, add_pooling_layer=False), pooling="mean").eval()
    ids = torch.tensor([[2, 7, 9, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    types = torch.zeros_like(ids)
    with torch.no_grad():
        _, features = model(ids, mask, types)
        hidden = model.encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        _, unpadded = model(ids[:, :4], mask[:, :4], types[:, :4])
    assert torch.allclose(features[0], hidden[0, :4].mean(0), atol=1e-6)
    assert torch.allclose(features, unpadded, atol=1e-5)
    with pytest.raises(ValueError, match="fedmatch.settings.pooling"):
        CrossEncoder(BertModel(config, add_pooling_layer=False), pooling="max")


def test_the_cpu_scale_model_tells_a_questions_candidates_apart_before_training():
    # MiniLM is a mean-pooled sentence encoder: after its 2 lowest layers (model.keep_layers at cpu) the [CLS] state
    # is the same for every answer of a question (cosine 1.0000 on the mirror's FiQA and MedQuAD), so a head on it
    # scores every candidate alike. The cpu scale scores the mean of the token states instead.
    params = parse_params(with_change("scale", "cpu"))
    tokenizer = load_tokenizer(params.model.backbone)
    torch.manual_seed(0)
    model = build_model_factory(params, tokenizer, "bert")().eval()
    question = "what are the symptoms of a broken ankle"
    answers = [
        "swelling, bruising and pain when you put weight on the foot",
        "the premium of a term life policy is lower than that of whole life",
    ]
    batch = tokenizer(
        [question] * 2,
        answers,
        truncation="longest_first",
        max_length=params.model.max_length,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        _, features = model(**batch)
    assert float(torch.cosine_similarity(features[0], features[1], dim=0)) < 0.99
