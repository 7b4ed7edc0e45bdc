"""Try a run's model: load the tuned (or base) model of a record once, then answer a conversation through the run's
chat template, greedy unless a temperature is given, token by token. `runner generate`, `runner chat` and the
wizard's Try screen all call this module."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from runner.errors import UserError
from runner.train.weights import base_model, load_model_dir, plain_state, record_spec, run_weights
from runner.spec import RunSpec

if TYPE_CHECKING:  # torch loads in the caller's worker (the Try screen imports this module on its UI thread)
    import torch

DEFAULT_MAX_NEW_TOKENS = 128
_LOADING = threading.Lock()
"""transformers builds a model under process-wide init contexts (meta device, skipped init): two loads at once in
two threads (the Try screen's tuned and base columns) leave one of them with meta tensors, so loads take turns."""
FIT_MARGIN = 1.2
"""Weights times this must fit the free memory: activations and the KV cache of one short conversation on top."""


@dataclass
class Answer:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    stopped: str
    """'eos' (the model ended its turn), 'length' (max_new_tokens) or 'cancelled'."""


@dataclass
class TryModel:
    """A loaded model with its tokenizer; `answer` may be called again and again (a chat)."""

    model: Any
    tokenizer: Any
    source: str
    device: str
    cancel: threading.Event = field(default_factory=threading.Event)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation through the run's chat template, ending with the assistant's generation prompt."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def answer(self, messages: list[dict[str, str]], max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
               temperature: float = 0.0, seed: int = 0, on_text: Callable[[str], None] | None = None) -> Answer:
        """The assistant's next turn. on_text gets each new piece of text as it is generated."""
        import torch

        ids = self.prompt_ids(messages)
        streamer = _TextPieces(self.tokenizer, len(ids), on_text)
        self.cancel.clear()
        stop = _Cancelled(self.cancel)
        sampling: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        if temperature > 0:
            torch.manual_seed(seed)
            sampling = {"do_sample": True, "temperature": temperature}
        with torch.no_grad():
            prompt = torch.tensor([ids], device=self.device)
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                      max_new_tokens=max_new_tokens, streamer=streamer, stopping_criteria=[stop],
                                      pad_token_id=self.tokenizer.pad_token_id, use_cache=True, **sampling)
        new = out[0, len(ids):].tolist()
        from runner.train.samples import eos_ids

        eos = eos_ids(self.model.generation_config, self.tokenizer)
        stopped = "cancelled" if self.cancel.is_set() else ("eos" if new and new[-1] in eos else "length")
        text = self.tokenizer.decode([t for t in new if t not in eos], skip_special_tokens=True)
        return Answer(text=text, token_ids=new, prompt_tokens=len(ids), stopped=stopped)


class _TextPieces:
    """A transformers streamer (called inside generate, in its thread) that hands on the new text of each token;
    the whole answer is decoded each time, so a character split over tokens comes out whole."""

    def __init__(self, tokenizer: Any, prompt_len: int, on_text: Callable[[str], None] | None) -> None:
        self.tokenizer, self.on_text, self.prompt_len = tokenizer, on_text, prompt_len
        self.ids: list[int] = []
        self.shown = ""
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate hands the prompt over first
            self.prompt_seen = True
            return
        self.ids += value.reshape(-1).tolist()
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.on_text is not None and not text.endswith("\ufffd") and len(text) > len(self.shown):
            self.on_text(text[len(self.shown):])
            self.shown = text

    def end(self) -> None:
        pass


class _Cancelled:
    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
        import torch

        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


def try_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def fit_problem(record: dict[str, Any], spec: RunSpec, device: str) -> str | None:
    """Why the model cannot be loaded on this device (the run's estimate of its parameters, at its weight dtype,
    against the memory free now), or None."""
    import psutil
    import torch

    params = ((record.get("estimate") or {}).get("arch") or {}).get("params_total")
    if not params:
        return None
    bytes_per = 4 if spec.model.dtype == "float32" else 2
    need = params * bytes_per * FIT_MARGIN
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else psutil.virtual_memory().available
    if need <= free:
        return None
    gib = 2 ** 30
    return (f"the model does not fit this {device}: its {params / 1e9:.1f}B parameters (the run's estimate) take "
            f"{need / gib:.1f} GiB in {spec.model.dtype} with room to generate, and {free / gib:.1f} GiB are free; "
            "try it on a machine with more memory")


def load_for_try(record: dict[str, Any], base: bool = False, device: str | None = None) -> TryModel:
    """The record's tuned model (its export, else its last checkpoint) or, with base, the model it started from."""
    from runner.train.model import load_tokenizer

    device = device or try_device()
    spec = record_spec(record)
    reason = fit_problem(record, spec, device)
    if reason:
        raise UserError(reason)
    with _LOADING:
        if base:
            model, source = base_model(spec), f"base model {spec.model.id}"
        else:
            weights = run_weights(record)
            source = weights.source
            if weights.model_dir is not None:
                model = load_model_dir(weights.model_dir, spec)
            else:
                model = base_model(spec)
                model.load_state_dict(plain_state(weights))
        model.config.use_cache = True
        return TryModel(model.to(device), load_tokenizer(spec), source, device)
