"""Generate: text from fixed prompts with a tiny GPT-2, logged as a table to the file,
TensorBoard, console and in-memory destinations at the right batches."""

import io

import pytest
import torch

from multirank import run_ranks
from trainkit.core import CallbackError, ParallelStrategy, dist
from trainkit.loggers import (
    ConsoleLogger,
    FileLogger,
    Generate,
    GenerateConfig,
    InMemoryLogger,
    TensorBoardLogger,
    read_jsonl,
)
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["[PAD]", "[UNK]", "[EOS]", *(f"w{i}" for i in range(13))]
PROMPTS = ["w1 w2 w3", "w5"]
COLUMNS = ["prompt", "decoding", "generation"]


def _tokenizer(pad: bool = False):
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    words.pre_tokenizer = Whitespace()
    special = {"pad_token": "[PAD]"} if pad else {}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="[UNK]", eos_token="[EOS]", **special
    )


def _model(tokenizer=None, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=len(WORDS),
        n_positions=64,
        bos_token_id=2,
        eos_token_id=2,
        loss_type="ForCausalLM",
    )
    return HuggingFaceModel(transformers.GPT2LMHeadModel(config), tokenizer=tokenizer)


def _batches(count=6):
    ids = (torch.arange(12)[None] + torch.arange(4)[:, None]) % 13 + 3  # w0 w1 w2 ... counting
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}] * count


def _fit(model, *callbacks, loggers=(), duration="5ba", batches=None):
    trainer = Trainer(
        model=model,
        train_dataloader=batches or _batches(),
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        run_name="gen",
        callbacks=list(callbacks),
        loggers=list(loggers),
    )
    trainer.fit()
    trainer.close()
    return trainer


def _greedy(model, prompt, max_new_tokens):
    """What greedy decoding gives now, computed independently of the callback."""
    tokenizer = model.tokenizer
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        out = model.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            do_sample=False, pad_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_generations_reach_the_file_tensorboard_and_memory_at_the_right_batches(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _model(_tokenizer())
    file = FileLogger(folder=tmp_path / "{run_name}")
    board = TensorBoardLogger(log_dir=tmp_path / "tb")
    memory = InMemoryLogger()
    generate = Generate(
        prompts=PROMPTS, interval="2ba", max_new_tokens=4, decoding=["greedy", "sample"]
    )
    _fit(model, generate, loggers=[file, board, memory])

    # Every 2 batches, and at the end of training.
    tables = [r for r in read_jsonl(file.path) if "table" in r]
    assert [r["step"] for r in tables] == [2, 4, 5]
    for record in tables:
        table = record["table"]
        assert table["name"] == "generations" and table["columns"] == COLUMNS
        assert [row[:2] for row in table["rows"]] == [
            [prompt, way] for prompt in PROMPTS for way in ("greedy", "sample")
        ]
        assert all(isinstance(row[2], str) for row in table["rows"])
    # The last greedy generations are the trained model's.
    last = {(p, w): text for p, w, text in tables[-1]["table"]["rows"]}
    for prompt in PROMPTS:
        expected = _greedy(model, prompt, 4)
        assert expected and last[(prompt, "greedy")] == expected
    assert [(name, step) for name, step, _, _ in memory.tables] == [
        ("generations", 2),
        ("generations", 4),
        ("generations", 5),
    ]
    assert [rows for *_, rows in memory.tables] == [r["table"]["rows"] for r in tables]

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    texts = events.Tensors("generations/text_summary")
    assert [t.step for t in texts] == [2, 4, 5]
    markdown = texts[-1].tensor_proto.string_val[0].decode()
    assert markdown.splitlines()[:2] == ["| prompt | decoding | generation |", "|---|---|---|"]
    assert f"| w1 w2 w3 | greedy | {last[('w1 w2 w3', 'greedy')]} |" in markdown


def test_epoch_intervals_generate_once_at_the_end_of_each_epoch():
    memory = InMemoryLogger()
    generate = Generate(prompts=["w4"], interval="1ep", max_new_tokens=2)
    _fit(_model(_tokenizer()), generate, loggers=[memory], duration="2ep", batches=_batches(3))
    assert [step for _, step, _, _ in memory.tables] == [3, 6]  # not twice at the end


def test_sampling_leaves_the_runs_random_streams_alone_and_is_reproducible():
    """GPT-2 has dropout, so training reads the random stream: a run with sampled
    generations trains exactly as one without, and its samples repeat run to run."""
    plain = _model(_tokenizer())
    _fit(plain, duration="3ba")
    runs = []
    for _ in range(2):
        model, memory = _model(_tokenizer()), InMemoryLogger()
        sample = Generate(prompts=PROMPTS, interval="1ba", max_new_tokens=6, decoding=["sample"])
        _fit(model, sample, loggers=[memory], duration="3ba")
        for mine, theirs in zip(model.parameters(), plain.parameters(), strict=True):
            assert torch.equal(mine, theirs)
        runs.append([rows for *_, rows in memory.tables])
    assert runs[0] == runs[1]
    assert len(runs[0]) == 3


def test_the_tokenizer_and_the_model_mode_are_left_as_they_were():
    tokenizer = _tokenizer()
    model = _model(tokenizer)
    assert tokenizer.padding_side == "right" and tokenizer.pad_token is None
    modes = []

    class Modes:
        def batch_end(self, state, logger):
            modes.append(state.model.training)

    _fit(model, Generate(prompts=PROMPTS, interval="1ba", max_new_tokens=2), Modes())
    assert tokenizer.padding_side == "right" and tokenizer.pad_token is None
    assert modes == [True] * 5


def test_a_tokenizer_with_a_pad_token_pads_with_it():
    memory = InMemoryLogger()
    generate = Generate(prompts=PROMPTS, interval="5ba", max_new_tokens=3)
    model = _model(_tokenizer(pad=True))
    _fit(model, generate, loggers=[memory])
    ((_, _, _, rows),) = memory.tables
    assert [text for *_, text in rows] == [_greedy(model, p, 3) for p in PROMPTS]


def test_the_console_prints_each_row():
    stream = io.StringIO()
    console = ConsoleLogger(stream=stream, interval="100ba", print_hyperparameters=False)
    _fit(
        _model(_tokenizer()),
        Generate(prompts=["w7"], interval="5ba", max_new_tokens=2),
        loggers=[console],
    )
    lines = stream.getvalue().splitlines()
    start = lines.index("[generations at batch 5]")
    assert lines[start + 1].startswith("  prompt: 'w7'  decoding: 'greedy'  generation: '")


def test_a_model_that_cannot_generate_fails_before_training():
    from toy import blobs, loader, mlp

    with pytest.raises(CallbackError, match="Generate needs a HuggingFaceModel wrapping a causal"):
        Trainer(
            model=mlp(), train_dataloader=loader(blobs(32)), max_duration="2ba", device="cpu",
            progress_bar=False, callbacks=[Generate(prompts=["x"])],
        ).fit()  # fmt: skip
    with pytest.raises(CallbackError, match=r"HuggingFaceModel\(model, tokenizer=tokenizer\)"):
        _fit(_model(tokenizer=None), Generate(prompts=["w1"]))
    with pytest.raises(CallbackError, match="Generate has no prompts"):
        _fit(_model(_tokenizer()), Generate())


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="give a list of strings"):
        GenerateConfig(prompts="w1 w2")
    with pytest.raises(ValueError, match="decoding \\['beam'\\] is not valid; give one or both"):
        GenerateConfig(decoding=["beam"])
    with pytest.raises(ValueError, match="max_new_tokens 0 is not valid"):
        GenerateConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature 0 is not valid"):
        GenerateConfig(temperature=0)
    with pytest.raises(ValueError, match=r"top_p 1\.5 is not valid"):
        GenerateConfig(top_p=1.5)
    with pytest.raises(ValueError, match="interval"):
        GenerateConfig(interval="soon")


class _FSDP2(ParallelStrategy):
    """FSDP2 placed as trainkit-parallel's ``wrap="auto"`` does: each block, then the root
    (which keeps the embeddings, the last norm and the head)."""

    def prepare(self, state):
        from torch.distributed.fsdp import fully_shard

        for block in state.model.model.transformer.h:
            fully_shard(block)
        fully_shard(state.model)

    @property
    def data_parallel_size(self):
        return dist.get_world_size()


def _generate_under_fsdp(rank, world_size):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model, memory = _model(_tokenizer()), InMemoryLogger()
    generate = Generate(
        prompts=PROMPTS, interval="2ba", max_new_tokens=4, decoding=["greedy", "sample"]
    )
    trainer = Trainer(
        model=model, train_dataloader=_batches(), max_duration="3ba", device="cpu",
        progress_bar=False, seed=0, parallelism=_FSDP2(), callbacks=[generate], loggers=[memory],
    )  # fmt: skip
    trainer.fit()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    trainer.close()
    reference = _model(_tokenizer())
    reference.load_state_dict(full)
    return memory.tables, {p: _greedy(reference, p, 4) for p in PROMPTS}


def test_every_rank_generates_under_fsdp2_and_rank_zero_logs():
    (tables, expected), (others, _) = run_ranks(_generate_under_fsdp, 2)
    assert [step for _, step, _, _ in tables] == [2, 3]
    assert others == []  # rank 1 took part in every forward but logged nothing
    last = {(p, w): text for p, w, text in tables[-1][3]}
    assert {p: last[(p, "greedy")] for p in PROMPTS} == expected
