"""Small models, training runs and comparisons shared by the trainkit.parallel tests.

Every distributed run is compared with the same run in one process on the same global
batches: data-parallel rank r of W reads every W-th sample of each global batch
(DistributedSampler without shuffling), so the ranks together see exactly the single
process's batch. Ranks of one tensor-parallel group read the same samples.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from toy import blobs
from trainkit.core import Callback, TrainModel
from trainkit.trainer import HuggingFaceModel, Trainer

GLOBAL_BATCH = 16


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Blocks(TrainModel):
    """An input layer, a ModuleList of residual blocks (what wrap='auto' finds), a head."""

    def __init__(self, features: int = 8, width: int = 16, depth: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, batch: Any) -> torch.Tensor:
        hidden = self.embed(batch[0])
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


class OOMBlock(Block):
    """Raises torch.OutOfMemoryError on inputs of more than ``limit`` samples."""

    limit = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"fake out-of-memory: {x.shape[0]} > {self.limit}")
        return super().forward(x)


def oom_blocks() -> Blocks:
    """`Blocks` whose middle block runs out of memory above 2 samples."""
    model = Blocks()
    model.blocks[1].__class__ = OOMBlock
    return model


BLOCKS_TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


class LossLog(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def batch_end(self, state, logger) -> None:
        self.losses.append(float(state.total_loss))


class ClipGrad(Callback):
    """Clips the gradient norm before the step (DTensor gradients included)."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def after_train_batch(self, state, logger) -> None:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), self.max_norm)


class Tokens(Dataset):
    """Random token sequences for causal language models (labels = inputs)."""

    def __init__(self, samples: int = 48, length: int = 8, vocab: int = 64):
        generator = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, vocab, (samples, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class MaskedTokens(Tokens):
    """`Tokens` whose labels leave out (-100) most positions of every odd sample: the ranks
    of a data-parallel run hold very different numbers of label tokens."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        labels = self.ids[index].clone()
        if index % 2:
            labels[:6] = -100
        return {"input_ids": self.ids[index], "labels": labels}


class UnlabelledOdd(Tokens):
    """`Tokens` whose odd samples have no label at all (-100), for a masked language model:
    the rank that reads them has nothing to weigh."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        labels = self.ids[index].clone()
        labels[: 8 if index % 2 else 4] = -100
        return {"input_ids": self.ids[index], "labels": labels}


LENGTH = 16
"""Sequence length of `PositionwiseLM` and `PartlyLabelled`."""


class PositionwiseLM(nn.Module):
    """A causal LM without attention, with transformers' forward signature and loss
    (``shift_labels``, ``num_items_in_batch``): position t's logits depend on token t and
    position t only, so context parallel on CPU (where ring attention cannot run) changes
    nothing but where each position is computed."""

    def __init__(self, vocab: int = 64, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(LENGTH, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(
        self,
        input_ids,
        labels=None,
        position_ids=None,
        shift_labels=None,
        num_items_in_batch=None,
        **kwargs,  # other inputs (token_type_ids, ...), unused as in many transformers models
    ):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        hidden = self.embed(input_ids) + self.position(position_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.head(hidden)
        loss = None
        if labels is not None:  # transformers' ForCausalLMLoss
            if shift_labels is None:
                shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
            loss = F.cross_entropy(
                logits.flatten(0, 1), shift_labels.flatten(), ignore_index=-100, reduction="sum"
            )
            loss = loss / (num_items_in_batch or (shift_labels != -100).sum())
        return {"loss": loss, "logits": logits}


def positionwise_lm() -> HuggingFaceModel:
    """`PositionwiseLM` as the Trainer's model."""
    return HuggingFaceModel(PositionwiseLM(), shift_labels=True)


class PartlyLabelled(Tokens):
    """Sequences of 16 tokens; the odd ones have no label on their first 10 positions, so
    the ranks of a context group hold different numbers of label tokens."""

    def __init__(self) -> None:
        super().__init__(samples=48, length=LENGTH)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        labels = self.ids[index].clone()
        if index % 2:
            labels[:10] = -100
        return {"input_ids": self.ids[index], "labels": labels}


def import_transformers() -> None:
    """Import the transformers models here, before forking, so no rank imports them again."""
    from transformers import BertForMaskedLM, GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401


def gpt2() -> HuggingFaceModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return HuggingFaceModel(GPT2LMHeadModel(config))


def bert() -> HuggingFaceModel:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        vocab_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return HuggingFaceModel(BertForMaskedLM(config))


def llama() -> HuggingFaceModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=16,
    )  # fmt: skip
    return HuggingFaceModel(LlamaForCausalLM(config))


def loader(dataset: Dataset, data_rank: int, data_world: int) -> DataLoader:
    if data_world == 1:
        return DataLoader(dataset, batch_size=GLOBAL_BATCH, shuffle=False)
    sampler = DistributedSampler(dataset, num_replicas=data_world, rank=data_rank, shuffle=False)
    return DataLoader(dataset, batch_size=GLOBAL_BATCH // data_world, sampler=sampler)


def make_trainer(
    strategy: Any,
    rank: int,
    world: int,
    *,
    model: Callable[[], nn.Module] = Blocks,
    tensor: int = 1,
    context: int = 1,
    batches: int = 3,
    optimizer: str = "adamw",
    data: Dataset | None = None,
    **kwargs: Any,
) -> Trainer:
    """A Trainer on this rank's share of the data (``context * tensor`` neighbouring ranks
    share each slice; default data: `Tokens` for language models, else blobs)."""
    network = model()
    if data is None:
        data = Tokens() if isinstance(network, HuggingFaceModel) else blobs(64, seed=1)
    if optimizer == "adamw":
        built = torch.optim.AdamW(network.parameters(), lr=0.02)
    else:
        built = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
    return Trainer(
        model=network,
        train_dataloader=loader(data, rank // (context * tensor), world // (context * tensor)),
        max_duration=f"{batches}ba",
        optimizers=built,
        parallelism=strategy,
        device="cpu",
        progress_bar=False,
        seed=7,
        **kwargs,
    )


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, gathered in full on rank 0 (collective; {} on other ranks)."""
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    sharded = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    full = {}
    for name, value in sharded.items():
        if isinstance(value, DTensor):
            if any(isinstance(p, _StridedShard) for p in value.placements):
                value = _gathered_by_position(value)
            else:
                value = value.full_tensor()
        full[name] = value.detach().cpu().clone()
    rank = tdist.get_rank() if tdist.is_initialized() else 0
    return full if rank == 0 else {}


def _gathered_by_position(tensor: Any) -> torch.Tensor:
    # torch 2.11's DTensor cannot re-lay out a _StridedShard (full_tensor() fails), so every
    # rank's values travel with their positions in the whole tensor: an index tensor laid
    # out by the same placements (a local split, no communication).
    import torch.distributed as tdist
    from torch.distributed.tensor import distribute_tensor

    index = torch.arange(tensor.numel(), device=tensor.to_local().device).view(tensor.shape)
    where = distribute_tensor(index, tensor.device_mesh, tensor.placements, src_data_rank=None)
    pieces: list[Any] = [None] * tdist.get_world_size()
    mine = (where.to_local().flatten().cpu(), tensor.to_local().detach().flatten().cpu())
    tdist.all_gather_object(pieces, mine)
    whole = torch.empty(tensor.numel(), dtype=tensor.dtype)
    for positions, values in pieces:
        whole[positions] = values
    return whole.view(tensor.shape)


def to_bytes(obj: Any) -> bytes:
    """Tensors as bytes: a forked rank exits at once, so it cannot share tensor memory."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def train(strategy: Any, rank: int, world: int, **kwargs: Any) -> bytes:
    """Train; return the full weights as bytes (filled on rank 0, empty on the others)."""
    trainer = make_trainer(strategy, rank, world, **kwargs)
    trainer.fit()
    return to_bytes(full_weights(trainer.state.model))


def max_difference(a: Any, b: Any) -> float:
    """Largest absolute difference between two sets of weights (dicts or their bytes)."""
    a = from_bytes(a) if isinstance(a, bytes) else a
    b = from_bytes(b) if isinstance(b, bytes) else b
    assert a.keys() == b.keys(), f"different names: {sorted(a.keys() ^ b.keys())}"
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_close(runs: dict[str, Any], references: dict[str, Any], tolerance: float) -> None:
    """Every named run's weights are within ``tolerance`` of its reference's."""
    differences = {name: max_difference(runs[name], references[name]) for name in runs}
    far = {name: d for name, d in differences.items() if d > tolerance}
    assert not far, f"runs differ from one process by more than {tolerance}: {far}"


def stage_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's parameters, whole: under pipeline parallel, its stages' (collective
    within each FSDP / tensor-parallel group)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in model.named_parameters()
    }


def pipeline_with_fsdp(rank: int, tensor: int = 1, batches: int = 2, **kwargs: Any) -> Trainer:
    """A 2-stage Llama run, each stage sharded over 2 ranks (x ``tensor`` with TP)."""
    from trainkit.parallel import FSDP, PipelineParallel, TensorParallel, llama_plan

    fsdp = FSDP()
    if tensor > 1:
        fsdp = FSDP(tensor_parallel=TensorParallel(plan=llama_plan(), degree=tensor))
    strategy = PipelineParallel(plan="llama", degree=2, fsdp=fsdp)
    # rank = (p * S + s) * T + t: the 2 shard ranks of a stage read the 2 data slices.
    return make_trainer(
        strategy, rank // tensor % 2, 2, model=llama, tensor=1, batches=batches,
        device_train_microbatch_size=4, **kwargs,
    )  # fmt: skip
