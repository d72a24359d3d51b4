"""Distillation's loss and its teacher logits, on tiny real models."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import TINY_BERT, separable_texts, train_cfg
from omegaconf import OmegaConf

from tuner.data.batches import Batch
from tuner.data.tokens import TokenizedTexts
from tuner.models import build_model
from tuner.training import batch_loss, collect_logits, train
from tuner.training.distill import Distillation, LayerOutputs, hidden_loss, soft_loss
from tuner.training.mixing import BatchOutput
from tuner.trial.students import student_of


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def _softmax(logits: list[float]) -> list[float]:
    exps = [math.exp(x) for x in logits]
    return [e / sum(exps) for e in exps]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_soft_loss_is_t_squared_times_the_kl_of_softened_outputs(temperature):
    student = [[0.0, 0.0, 1.0], [2.0, -1.0, 0.5]]
    teacher = [[math.log(3), 0.0, 0.0], [0.0, 1.0, -2.0]]
    expected = sum(
        _kl(_softmax([x / temperature for x in t]), _softmax([x / temperature for x in s]))
        for s, t in zip(student, teacher, strict=True)
    ) / len(student)
    got = soft_loss(torch.tensor(student), torch.tensor(teacher), temperature)
    assert float(got) == pytest.approx(expected * temperature**2, rel=1e-5)


def test_the_loss_weighs_hard_and_soft_terms_by_alpha():
    logits = torch.tensor([[1.0, -1.0], [0.2, 0.3]])
    teacher_logits = torch.tensor([[3.0, 0.0], [-1.0, 1.0]])
    hard = torch.tensor(0.7)
    output = BatchOutput(hard, logits)
    batch = Batch((torch.zeros(2, 1),), torch.tensor([0, 1]), torch.tensor([1, 0]))
    # Teacher logits of the training set in data order: example 1 first in this batch.
    cached = teacher_logits[[1, 0]]
    soft = float(soft_loss(logits, teacher_logits, 2.0))
    for alpha in (0.0, 0.5, 1.0):
        loss = Distillation(torch.nn.Identity(), alpha, 2.0, cached).loss(output, batch)
        assert float(loss) == pytest.approx((1 - alpha) * 0.7 + alpha * soft, rel=1e-6)


def test_alpha_zero_trains_exactly_as_plain_training(tiny_bert):
    data = separable_texts()
    cfg = train_cfg()
    plain, distilled = copy.deepcopy(tiny_bert), copy.deepcopy(tiny_bert)
    torch.manual_seed(7)
    teacher = TINY_BERT.build()  # other weights: its soft targets differ from the labels
    distillation = Distillation.of(teacher, 0.0, 2.0, data)
    # Dropout draws from the global generator, as in a trial (seeded before training).
    torch.manual_seed(0)
    train(plain, data, data, cfg, batch_loss("text", cfg, 2))
    torch.manual_seed(0)
    train(distilled, data, data, cfg, batch_loss("text", cfg, 2), distillation=distillation)
    for (name, a), b in zip(
        plain.state_dict().items(), distilled.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_teacher_pulls_the_student_towards_its_outputs(tiny_bert):
    """With alpha 1 the student learns the teacher's outputs, whatever the labels say: here a
    teacher that predicts the opposite of every label."""
    data = separable_texts()
    cfg = train_cfg(epochs=6, lr=3e-3)
    teacher = copy.deepcopy(tiny_bert)
    train(teacher, data, data, cfg, batch_loss("text", cfg, 2))
    flipped = TokenizedTexts(data.input_ids, data.attention_mask, 1 - data.labels)
    predicted = collect_logits(teacher.eval(), data).argmax(-1)
    assert float((predicted == data.labels).float().mean()) > 0.9
    student = copy.deepcopy(tiny_bert)
    distillation = Distillation.of(teacher, 1.0, 1.0, data)
    train(student, flipped, flipped, cfg, batch_loss("text", cfg, 2), distillation=distillation)
    agreement = (collect_logits(student.eval(), data).argmax(-1) == data.labels).float().mean()
    assert float(agreement) > 0.9


def test_unmixed_batches_read_the_teachers_logits_of_their_own_examples(tiny_bert):
    data = separable_texts()
    distillation = Distillation.of(tiny_bert, 0.5, 2.0, data)
    with torch.inference_mode():
        for batch in data.batches(8, torch.Generator().manual_seed(0), group_by_length=True):
            direct = tiny_bert(*batch.inputs)
            assert torch.allclose(distillation.train_logits[batch.index], direct, atol=1e-5)


def test_a_mixed_text_batch_is_shown_to_the_teacher_mixed_the_same_way(tiny_bert):
    """The teacher sees the same lam and partners: a teacher identical to the (eval-mode)
    student gives exactly the student's mixed logits."""
    data = separable_texts()
    model = tiny_bert.eval()
    loss_of = batch_loss("text", train_cfg(mixup_alpha=0.4), 2)
    batch = next(data.batches(8, torch.Generator().manual_seed(0)))
    output = loss_of(model, batch, torch.Generator().manual_seed(5))
    assert output.mixed_logits_of is not None
    with torch.no_grad():
        teacher_logits = output.mixed_logits_of(copy.deepcopy(model))
        assert torch.allclose(teacher_logits, output.logits, atol=1e-5)
        # and not the unmixed batch's logits
        assert not torch.allclose(output.logits, model(*batch.inputs), atol=1e-3)


def test_hidden_loss_averages_squared_differences_over_real_tokens_and_layers():
    # One example of three tokens, the last one padding; hidden size 2; two student layers,
    # and a teacher with three (the student kept the bottom two).
    mask = torch.tensor([[1, 1, 0]])
    student = [torch.zeros(1, 3, 2), torch.ones(1, 3, 2)]
    teacher = [
        torch.tensor([[[1.0, 1.0], [3.0, 1.0], [100.0, 100.0]]]),
        torch.tensor([[[1.0, 1.0], [1.0, 1.0], [-50.0, 9.0]]]),
        torch.full((1, 3, 2), 7.0),
    ]
    # Layer 0: (1 + 1 + 9 + 1) / 4 tokens-by-features = 3; layer 1: 0; mean 1.5.
    assert float(hidden_loss(student, teacher, mask)) == pytest.approx(1.5)


def _hidden_distance(student, teacher, data) -> float:
    batch = next(data.batches(len(data)))
    with torch.no_grad():
        outputs = []
        for model in (student, teacher):
            layers = LayerOutputs(model.eval())
            with layers.watching():
                model(*batch.inputs)
                outputs.append(layers.taken())
    return float(hidden_loss(outputs[0], outputs[1], batch.inputs[1]))


def test_hidden_states_transfer_pulls_the_students_layers_towards_the_teachers(tiny_bert):
    data = separable_texts()
    cfg = train_cfg(epochs=4, lr=3e-3)
    teacher = copy.deepcopy(tiny_bert)
    torch.manual_seed(0)
    train(teacher, data, data, cfg, batch_loss("text", cfg, 2))
    distances = {}
    for weight in (0.0, 1.0):
        torch.manual_seed(11)
        student = TINY_BERT.build()
        distillation = Distillation.of(teacher, 0.5, 2.0, data)
        distillation.hidden_weight = weight
        torch.manual_seed(0)
        train(student, data, data, cfg, batch_loss("text", cfg, 2), distillation=distillation)
        # The hooks are gone once training ends: deployment sees the plain model.
        assert all(not layer._forward_hooks for layer in student.encoder.encoder.layer)
        distances[weight] = _hidden_distance(student, teacher, data)
    assert distances[1.0] < 0.5 * distances[0.0]


def test_a_student_starts_from_the_teachers_weights_with_its_edits_applied(tiny_bert):
    teacher = tiny_bert
    up = "encoder.encoder.layer.0.intermediate.dense"
    down = "encoder.encoder.layer.0.output.dense"
    layers = teacher.encoder.encoder.layer
    with torch.no_grad():
        # Neurons 3 and 1000 of every FFN are made by far the most important (their row of
        # the up-projection and column of the down-projection 1000 times the others').
        for layer in layers:
            layer.intermediate.dense.weight[[3, 1000]] *= 1000
            layer.output.dense.weight[:, [3, 1000]] *= 1000
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    edits = OmegaConf.create({**TINY_BERT.model, "ffn_width": 2, "num_layers": 1})

    # A transformer student is a copy of its teacher, edited: nothing is built for it.
    student = student_of(teacher, edits, build=lambda: pytest.fail("built a student anew"))

    theirs = teacher.state_dict()
    mine = student.state_dict()
    # The bottom layer kept, its FFN down to neurons 3 and 1000, everything else the teacher's
    # own (embeddings, attention, norms, pooler and the trained head: nothing initialised).
    assert len(student.encoder.encoder.layer) == 1
    assert torch.equal(mine[f"{up}.weight"], theirs[f"{up}.weight"][[3, 1000]])
    assert torch.equal(mine[f"{up}.bias"], theirs[f"{up}.bias"][[3, 1000]])
    assert torch.equal(mine[f"{down}.weight"], theirs[f"{down}.weight"][:, [3, 1000]])
    assert torch.equal(mine[f"{down}.bias"], theirs[f"{down}.bias"])
    assert sorted(mine) == sorted(k for k in theirs if ".layer.1." not in k)
    for name, value in mine.items():
        if not name.startswith((up, down)):
            assert torch.equal(value, theirs[name]), name
    # The teacher is left whole and shares no tensor with the student.
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(1.0)
    assert len(layers) == 2 and layers[0].intermediate.dense.out_features == 1536
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, before[name]), name


_RESNET = {"family": "timm", "name": "resnet18", "in_chans": 1, "drop_rate": 0.0, "kwargs": {}}


def _resnet(**sizes) -> torch.nn.Module:
    cfg = OmegaConf.create({**_RESNET, "width_multiplier": None, "depth": None, **sizes})
    return build_model(cfg, 10)


def _gate(norm: torch.nn.BatchNorm2d, channels: list[int], scale: float = 1.0) -> None:
    """Make `channels` the norm's important ones: scale `scale` there, 1e-3 elsewhere."""
    norm.weight.fill_(1e-3)
    norm.weight[channels] = scale


def test_a_narrower_shallower_resnet_starts_from_the_teachers_most_important_channels():
    torch.manual_seed(0)
    teacher = _resnet().eval()  # resnet18 at full width: stages of 64, 128, 256, 512 channels
    net = teacher.net
    with torch.no_grad():
        for norm in (m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
        # Stage 1 (no projection shortcut in the teacher: 64 channels in, 64 out): its kept
        # channels are chosen by its first block's last norm alone; the second block, which
        # the 1-block student drops, gates other channels and must not count.
        stage1 = list(range(0, 64, 4))
        _gate(net.layer1[0].bn2, stage1)
        _gate(net.layer1[1].bn2, list(range(1, 17)), scale=10.0)
        inner1 = list(range(48, 64))
        _gate(net.layer1[0].bn1, inner1)
        # Stage 2: the residual branch's norm gates 24 channels, the projection's 8 more.
        stage2 = [*range(24), *range(100, 108)]
        _gate(net.layer2[0].bn2, stage2[:24])
        _gate(net.layer2[0].downsample[1], stage2[24:])
        inner2 = list(range(96, 128))
        _gate(net.layer2[0].bn1, inner2)
        _gate(net.layer4[0].bn2, list(range(1, 129)))
        _gate(net.layer4[0].downsample[1], list(range(1, 129)))
    before = {k: v.clone() for k, v in teacher.state_dict().items()}

    # Width 0.25 (16, 32, 64, 128 channels), one block per stage.
    sizes = {"width_multiplier": 0.25, "depth": 1}
    student = student_of(teacher, OmegaConf.create({**_RESNET, **sizes}), lambda: _resnet(**sizes))

    mine, theirs = student.net, net
    assert [len(getattr(mine, f"layer{i}")) for i in (1, 2, 3, 4)] == [1, 1, 1, 1]
    assert torch.equal(mine.conv1.weight, theirs.conv1.weight)  # the stem, whole
    block, source = mine.layer1[0], theirs.layer1[0]
    assert torch.equal(block.conv1.weight, source.conv1.weight[inner1])
    assert torch.equal(block.bn1.running_var, source.bn1.running_var[inner1])
    assert torch.equal(block.conv2.weight, source.conv2.weight[stage1][:, inner1])
    assert torch.equal(block.bn2.bias, source.bn2.bias[stage1])
    # The teacher's stage 1 adds its input unchanged; the student's needs a projection (64
    # channels in, 16 out), which passes the kept channels through, its norm at the identity.
    selection = torch.zeros(16, 64)
    selection[range(16), stage1] = 1.0
    assert torch.equal(block.downsample[0].weight.reshape(16, 64), selection)
    assert torch.equal(block.downsample[1].weight, torch.ones(16))
    assert torch.equal(block.downsample[1].running_var, torch.ones(16))
    block, source = mine.layer2[0], theirs.layer2[0]
    assert torch.equal(block.conv1.weight, source.conv1.weight[inner2][:, stage1])
    assert torch.equal(block.conv2.weight, source.conv2.weight[stage2][:, inner2])
    assert torch.equal(block.downsample[0].weight, source.downsample[0].weight[stage2][:, stage1])
    assert torch.equal(block.downsample[1].weight, source.downsample[1].weight[stage2])
    assert torch.equal(block.bn2.weight, source.bn2.weight[stage2])
    stage4 = list(range(1, 129))
    assert torch.equal(mine.fc.weight, theirs.fc.weight[:, stage4])
    assert torch.equal(mine.fc.bias, theirs.fc.bias)
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, before[name]), name

    # At the teacher's own size the student is the teacher, to the last bit.
    sizes = {"width_multiplier": 1.0, "depth": 2}
    whole = student_of(teacher, OmegaConf.create({**_RESNET, **sizes}), lambda: _resnet(**sizes))
    whole.eval()
    images = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(whole(images), teacher(images))


@pytest.mark.parametrize("name", ["resnet18", "resnet26", "resnet18d"])
def test_a_resnet_student_of_the_teachers_size_is_the_teacher(name):
    # Basic and bottleneck blocks, plain and average-pooled shortcuts.
    torch.manual_seed(0)
    teacher = build_model(OmegaConf.create({**_RESNET, "name": name}), 10).eval()
    with torch.no_grad():
        for norm in (m for m in teacher.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            norm.weight.uniform_(0.5, 1.5)
            norm.running_mean.uniform_(-1, 1)
    cfg = OmegaConf.create({**_RESNET, "name": name, "width_multiplier": 1.0})
    student = student_of(teacher, cfg, lambda: build_model(cfg, 10)).eval()
    images = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(student(images), teacher(images))


def test_a_quarter_width_bottleneck_resnet_adds_its_input_where_the_teacher_projects_it():
    # resnet26's first stage: 64 channels in, 256 out (a projection); a quarter of it: 64 out,
    # no projection. The branch is cut from the teacher's; the shortcut has nothing to take.
    teacher = build_model(OmegaConf.create({**_RESNET, "name": "resnet26"}), 10)
    cfg = OmegaConf.create({**_RESNET, "name": "resnet26", "width_multiplier": 0.25})
    student = student_of(teacher, cfg, lambda: build_model(cfg, 10))
    first = student.net.layer1[0]
    assert first.downsample is None and first.conv3.out_channels == 64
    assert teacher.net.layer1[0].downsample is not None
    assert student(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_layers_a_resnet_student_cannot_take_from_the_teacher_are_named():
    # Squeeze-and-excitation layers are not narrowed channel by channel.
    teacher = build_model(OmegaConf.create({**_RESNET, "name": "seresnet18"}), 10)
    cfg = OmegaConf.create({**_RESNET, "name": "seresnet18", "width_multiplier": 0.5})
    with pytest.raises(ValueError, match=r"no teacher weights for layer1\.0\.se\.fc1\.weight"):
        student_of(teacher, cfg, lambda: build_model(cfg, 10))


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"width_multiplier": 0.5, "depth": 1}, "layer1 has 32 channels, the teacher's only 16"),
        ({"width_multiplier": 0.25, "depth": 2}, "layer1 has 2 blocks, the teacher's only 1"),
    ],
)
def test_a_resnet_student_larger_than_its_teacher_is_refused(sizes, message):
    teacher = _resnet(width_multiplier=0.25, depth=1)
    student_cfg = OmegaConf.create({**_RESNET, "width_multiplier": None, "depth": None, **sizes})
    with pytest.raises(ValueError, match=message):
        student_of(teacher, student_cfg, build=lambda: build_model(student_cfg, 10))
