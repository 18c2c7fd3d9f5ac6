"""The ``generate`` stage on transformers: :class:`TransformersCausalLM`.

Decoding is transformers' own ``model.generate`` (KV cache, the model's own cache type and
masks), run on a thread of its own and handing each token over as soon as it is chosen. Using
``generate`` itself, not a copy of its loop, is what keeps greedy decoding identical, token for
token, to ``model.generate(do_sample=False)``, on every architecture and transformers version;
a vLLM stage engine is checked against exactly that.

Only the request's parameters shape the choice of tokens: the checkpoint's generation_config
gives the end-of-sequence ids and the default ``max_tokens``, never its sampling defaults
(``temperature``, ``top_p``, ``repetition_penalty``, ...), so "no temperature" always means
greedy. Sampling draws from the engine's own generator, seeded per request, never from
torch's global one (another stage in the same process cannot change a seeded answer).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from omni_core.errors import ChatRequestError, ModelLoadError, ModelRuntimeError
from omni_core.pipeline.stage import FinishReason, StageEngine
from omni_plugin_llm.text import (
    DEFAULT_MAX_TOKENS,
    IncrementalDetokenizer,
    SamplingParams,
    StopStrings,
    prompt_ids,
)

#: the engine options (a recipe's ``engine_options`` for the stage)
OPTIONS = ("dtype", "device")
_DTYPES = ("float32", "bfloat16", "float16", "auto")
#: how often a blocked hand-over looks whether the request was stopped
_POLL_S = 0.1


class TransformersCausalLM(StageEngine):
    """A decoder-only causal LM on transformers (``AutoModelForCausalLM``), one request at a time.

    Options: ``dtype`` (``float32``, the default, ``bfloat16``, ``float16`` or ``auto``: the
    checkpoint's) and ``device`` (default: the stage's first device on CUDA when there is one,
    else the CPU). Items: token ids (ints), the end-of-sequence token included when it ends the
    answer; :meth:`for_output` gives each one's text.
    """

    def __init__(self, model_dir: Path, stage: Any, options: dict[str, Any]) -> None:
        super().__init__(model_dir, stage, options)
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ModelLoadError(
                f"stage {stage.name!r}: the transformers engine does not take engine option(s) {unknown}; "
                f"it takes {', '.join(OPTIONS)}"
            )
        dtype_name = str(options.get("dtype", "float32"))
        if dtype_name not in _DTYPES:
            raise ModelLoadError(f"stage {stage.name!r}: engine option dtype must be one of {', '.join(_DTYPES)}")
        dtype = dtype_name if dtype_name == "auto" else getattr(torch, dtype_name)
        self.device = torch.device(options.get("device") or _default_device(getattr(stage, "devices", "0")))
        path = str(self.model_dir)
        self.tokenizer: Any
        self.model: Any
        from omni_core.quiet import quiet_libraries

        try:
            with quiet_libraries():  # transformers' per-tensor "Loading weights" bar and notes
                self.tokenizer = AutoTokenizer.from_pretrained(path)
                model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot load the language model: {type(exc).__name__}: {exc}") from None
        self.model = model.to(self.device).eval()
        checkpoint = model.generation_config
        eos = checkpoint.eos_token_id if checkpoint.eos_token_id is not None else self.tokenizer.eos_token_id
        #: the ids that end an answer (generation_config's, else the tokenizer's)
        self.eos_ids: tuple[int, ...] = (
            tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        )
        pad = checkpoint.pad_token_id
        pad = pad if pad is not None else self.tokenizer.pad_token_id
        self.pad_id: int = int(pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0))
        self.default_max_tokens: int = int(checkpoint.max_new_tokens or DEFAULT_MAX_TOKENS)
        self.context_length: int | None = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        # generate() fills what a request leaves unset from the model's generation_config: keep
        # only the token ids there, so the checkpoint's sampling defaults never leak in
        clean: Any = GenerationConfig
        self.model.generation_config = clean(bos_token_id=checkpoint.bos_token_id, pad_token_id=self.pad_id)
        self._pieces: deque[tuple[int, str]] = deque()

    # -- the contract --------------------------------------------------------------------------

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Generator[int, None, FinishReason]:
        """Decode one answer: yields each token id as soon as the model chooses it, and ends at
        an end-of-sequence token (unless ``ignore_eos``), after ``max_tokens`` tokens, or at the
        token that completes a stop string (the text then ends before the stop string).
        Returns how it ended: ``length`` when ``max_tokens`` ran out, else ``stop``."""
        self._pieces = deque()  # per request: nothing of an earlier answer carries over
        items = list(inputs)
        if len(items) != 1:
            raise ChatRequestError(f"the generate stage takes one input (a prompt or messages), got {len(items)}")
        sampling = SamplingParams.parse(params, default_max_tokens=self.default_max_tokens)
        ids = prompt_ids(self.tokenizer, items[0])
        if self.context_length is not None and len(ids) >= self.context_length:
            raise ChatRequestError(
                f"the prompt is {len(ids)} tokens; this model reads at most {self.context_length}: shorten it",
                field="messages",
            )
        detokenizer = IncrementalDetokenizer(self.tokenizer)
        stops = StopStrings(sampling.stop)
        ends = () if sampling.ignore_eos else self.eos_ids
        decoding = _Decoding(self, ids, sampling)
        try:
            for n, token in enumerate(decoding.tokens(), start=1):
                ended = token in ends
                last = ended or n >= sampling.max_tokens
                text, stopped = stops.feed(detokenizer.push(token, final=last), final=last)
                self._pieces.append((token, text))
                yield token
                if ended or stopped:  # the answer's own end wins over a budget that ends with it
                    return "stop"
                if last:
                    return "length"
        finally:
            decoding.stop()
        return "stop"

    def for_output(self, item: Any) -> str:
        """The text of a token this engine just yielded (in order: pieces are made in :meth:`run`,
        where stop strings are found, and handed out here)."""
        if not self._pieces:
            raise ModelRuntimeError(f"for_output({item!r}): no token of the current answer is waiting for its text")
        token, text = self._pieces.popleft()
        if token != item:
            raise ModelRuntimeError(f"for_output({item!r}): the next token of the current answer is {token}")
        return text

    def close(self) -> None:
        self.model = None
        self.tokenizer = None


def _default_device(devices: str) -> Any:
    """The stage's first device on this process's platform (the platform answers, not torch)."""
    from omni_core.platforms import current_platform

    first = str(devices or "0").split(",")[0].strip() or "0"
    return current_platform().device(int(first) if first.isdigit() else 0)


class _Decoding:
    """One ``model.generate`` call on a thread of its own, its tokens handed over one by one.

    The hand-over holds one token: the model runs at most one step ahead of the consumer, and
    a consumer that stops (stop string, cancelled request) stops the model at its next step."""

    _END = object()

    def __init__(self, engine: TransformersCausalLM, ids: list[int], sampling: SamplingParams) -> None:
        self.engine = engine
        self.sampling = sampling
        self.handoff: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.stopped = threading.Event()
        self.input_ids = torch.tensor([ids], dtype=torch.long, device=engine.device)
        self.thread = threading.Thread(target=self._generate, name="omni-llm-generate", daemon=True)

    def tokens(self) -> Iterator[int]:
        self.thread.start()
        while True:
            item = self.handoff.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise ModelRuntimeError(f"generation failed: {type(item).__name__}: {item}") from item
            yield item

    def stop(self) -> None:
        """Stop the model and wait for its thread (called when the consumer is done)."""
        self.stopped.set()
        while self.thread.is_alive():
            try:  # free a hand-over the model may be blocked on
                self.handoff.get(timeout=_POLL_S)
            except queue.Empty:
                pass
        if self.thread.ident is not None:
            self.thread.join()

    def _hand(self, item: Any) -> None:
        while not self.stopped.is_set():
            try:
                self.handoff.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def _generate(self) -> None:
        engine, sampling = self.engine, self.sampling
        processors = LogitsProcessorList()
        if not sampling.greedy:
            generator = torch.Generator(device=engine.device)
            if sampling.seed is not None:
                generator.manual_seed(sampling.seed)
            else:
                generator.seed()
            processors.append(_Sampler(sampling, generator))
        make_config: Any = GenerationConfig
        config = make_config(
            max_new_tokens=sampling.max_tokens,
            do_sample=False,  # greedy over the sampler's one-hot scores when sampling
            eos_token_id=list(engine.eos_ids) if engine.eos_ids and not sampling.ignore_eos else None,
            pad_token_id=engine.pad_id,
        )
        try:
            engine.model.generate(
                self.input_ids,
                attention_mask=torch.ones_like(self.input_ids),
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([_Stopped(self.stopped)]),
                streamer=_Streamer(self._hand),
            )
        except BaseException as exc:  # the request's failure, handed to the consumer
            self._hand(exc)
        else:
            self._hand(self._END)


class _Streamer(BaseStreamer):
    """Takes each new token from ``generate`` (its first call is the prompt: skipped)."""

    def __init__(self, hand: Any) -> None:
        self.hand = hand
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.hand(int(token))

    def end(self) -> None:
        pass


class _Stopped(StoppingCriteria):
    """A stopping criterion: the consumer is done with this answer."""

    def __init__(self, stopped: threading.Event) -> None:
        self.stopped = stopped

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        return torch.full((input_ids.shape[0],), self.stopped.is_set(), dtype=torch.bool, device=input_ids.device)


class _Sampler(LogitsProcessor):
    """Draws the next token (temperature, then top-k, then top-p) from the request's own
    generator and answers scores where only that token is finite, so ``generate``'s greedy
    step takes it."""

    def __init__(self, sampling: SamplingParams, generator: Any) -> None:
        self.sampling = sampling
        self.generator = generator

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        logits = scores.float() / self.sampling.temperature
        if 0 < self.sampling.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.sampling.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.sampling.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=True, dim=-1)
            probs = torch.softmax(ordered, dim=-1)
            # drop a token when the ones before it already hold top_p (the first always stays)
            drop = (torch.cumsum(probs, dim=-1) - probs) >= self.sampling.top_p
            drop[..., 0] = False
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generator)
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter(-1, token, 0.0)
