"""What the model says while it trains: greedy answers to train.eval_prompts every train.eval_every steps and at the
end, written by rank 0 as `sample` events. Every rank runs the same forwards (a sharded model needs all of them for
each), and rank 0's next token is broadcast, so the ranks stay in step to the last token."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from runner.events.lines import EventWriter
    from runner.spec import RunSpec

SAMPLE_MAX_NEW_TOKENS = 48
"""Answer length while training: enough to read what the model now says, short enough not to slow the run."""


def eval_prompts(spec: RunSpec) -> list[str]:
    """train.eval_prompts as a list: the list itself, or the non-empty lines of the file it names."""
    from runner.spec import resolve_embedded

    prompts = spec.train.eval_prompts
    if isinstance(prompts, str):
        return [line.strip() for line in resolve_embedded(prompts).read_text().splitlines() if line.strip()]
    return list(prompts)


def base_generation_config(spec: RunSpec) -> Any:
    """The model's generation_config.json, or None where it has none."""
    from runner.imports import from_transformers
    from runner.spec import model_source

    src, rev = model_source(spec)
    try:
        return from_transformers("GenerationConfig").from_pretrained(src, revision=rev)
    except OSError:
        return None


def eos_ids(generation_config: Any, tokenizer: Any) -> set[int]:
    """The tokens that end an answer: the generation config's end tokens and the tokenizer's."""
    eos = getattr(generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


@dataclass
class Sampler:
    """The prompts through the run's chat template, once; `run` answers them all and writes the events."""

    prompts: list[str]
    prompt_ids: list[list[int]]
    eos: set[int]
    tokenizer: Any
    every: int
    device: str
    rank: int
    seconds: float = 0.0  # time spent sampling, kept out of the training time and tokens/s

    @classmethod
    def build(cls, spec: RunSpec, tokenizer: Any, rank: int, device: str) -> Sampler | None:
        prompts = eval_prompts(spec)
        if not prompts:
            return None
        ids = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                       tokenize=False), add_special_tokens=False)["input_ids"]
               for p in prompts]
        return cls(prompts, ids, eos_ids(base_generation_config(spec), tokenizer), tokenizer, spec.train.eval_every,
                   device, rank)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    @torch.no_grad()
    def run(self, model: torch.nn.Module, step: int, events: EventWriter) -> None:
        start = time.perf_counter()
        was_training = model.training
        model.eval()
        for i, ids in enumerate(self.prompt_ids):
            new = greedy(model, ids, self.eos, self.device)
            if self.rank == 0:
                events.sample(step=step, index=i, prompt=self.prompts[i],
                              text=self.tokenizer.decode(new, skip_special_tokens=True))
        if was_training:
            model.train()
        self.seconds += time.perf_counter() - start


def greedy(model: torch.nn.Module, ids: list[int], eos: set[int], device: str,
           max_new_tokens: int = SAMPLE_MAX_NEW_TOKENS) -> list[int]:
    """Greedy continuation of ids, the whole sequence run again for each token (no cache: the training forward,
    whatever attention the run uses), rank 0's choice broadcast; the new tokens without the end-of-turn one."""
    from runner.train.attention import packing_kwargs
    from runner.train.loss import uses_varlen

    seq = list(ids)
    for _ in range(max_new_tokens):
        x = torch.tensor([seq], device=device)
        n = len(seq)
        batch: dict[str, Any] = {"position_ids": torch.arange(n, device=device)[None]}
        if uses_varlen(model):
            batch.update(cu_seqlens=torch.tensor([0, n], dtype=torch.int32, device=device), max_len=n)
        logits = model(input_ids=x, use_cache=False, **packing_kwargs(batch)).logits
        token = logits[0, -1].argmax().reshape(1)
        if dist.is_initialized():
            dist.broadcast(token, src=0)
        if int(token.item()) in eos:
            break
        seq.append(int(token.item()))
    return seq[len(ids):]


@dataclass
class WithSamples:
    """An Evaluator (or none: a run may sample without an eval set) that also answers the prompts, at the same
    steps (both follow train.eval_every, and the end): the engines call it as they call an Evaluator."""

    evaluator: Any
    sampler: Sampler

    def due(self, step: int) -> bool:
        return self.sampler.due(step)

    def restore(self, past_events: list[Any], step: int) -> None:
        if self.evaluator is not None:
            self.evaluator.restore(past_events, step)

    @property
    def seconds(self) -> float:
        return self.sampler.seconds + (self.evaluator.seconds if self.evaluator is not None else 0.0)

    def run(self, model: torch.nn.Module, step: int, events: EventWriter, sums_fn: Any = None) -> dict[str, Any]:
        fields = self.evaluator.run(model, step, events, sums_fn) if self.evaluator is not None else {"stop": False}
        self.sampler.run(model, step, events)
        return fields


def with_samples(evaluator: Any, spec: RunSpec, tokenizer: Any, rt: Any) -> Any:
    """The evaluator, answering train.eval_prompts too when the spec has some (rt: the rank's Runtime)."""
    sampler = Sampler.build(spec, tokenizer, rt.rank, rt.device)
    return evaluator if sampler is None else WithSamples(evaluator, sampler)
