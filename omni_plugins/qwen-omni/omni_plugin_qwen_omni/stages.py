"""The three stages of Qwen2.5-Omni, each a :class:`~omni_core.pipeline.stage.StageEngine` on
transformers' public Qwen2.5-Omni classes, loading only its own part of the checkpoint.

They compute what ``Qwen2_5OmniForConditionalGeneration.generate`` computes (given the attention
mask transformers 5 drops: see :func:`omni_plugin_qwen_omni.reference.generate`), split where its
three sub-models meet, so that each stage starts on its upstream's items as they arrive:

* ``thinker`` (ar): the prompt through the chat template (and the audio clips through the Whisper
  feature extractor), then one token at a time. Each item is a dict::

      {"token_id": int,                 # a text token (never the end-of-turn token)
       "embed": Tensor[H] | None,       # the token's input embedding in the thinker
       "hidden": Tensor[H] | None,      # the thinker's last hidden state at the token
       "last": bool,                    # no more tokens follow
       "prompt": {...}}                 # first item only: the prompt, for the talker (below)

  ``embed`` and ``hidden`` come from the forward pass that reads the token, so an item is
  yielded one step after its token is chosen; the last token is never read (None). ``prompt``
  is ``{"ids": Tensor[P], "embed": Tensor[P, H], "hidden": Tensor[P, H], "audio_feature_lengths":
  Tensor | None}`` (the embeddings of audio positions zeroed, as ``generate`` gives the talker).
  A client gets each token as its piece of text (``for_output``), empty until a character that
  spans several tokens is complete.
* ``talker`` (ar): codec codes, one per step, conditioned on the thinker's reply one token per
  step (``hidden + embed``; then the text end marker, then the text pad marker), so it runs one
  token behind the thinker. Items: ``{"code": int}``, the first with ``"voice": name`` too.
* ``token2wav`` (generation): once every code has arrived, the DiT (flow matching from seeded
  noise) and BigVGAN turn them into one item: the waveform, a 1-D float32 tensor at 24 kHz.
  It does not stream: its DiT attends across blocks of codes in both directions.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from omni_plugin_llm.text import StopStrings

from omni_core.errors import ChatRequestError, ModelLoadError, ModelRuntimeError
from omni_core.pipeline.stage import FinishReason, StageEngine
from omni_plugin_qwen_omni.model import DEFAULT_VOICE
from omni_plugin_qwen_omni.prompt import SPEECH_SYSTEM_PROMPT, Prompter
from omni_plugin_qwen_omni.sampling import Sampler

#: ``Qwen2_5OmniForConditionalGeneration.generate``'s defaults, which these stages keep
THINKER_MAX_TOKENS = 1024
TALKER_DEFAULTS: dict[str, Any] = {
    "max_tokens": 4096,
    "temperature": 0.9,
    "top_k": 40,
    "top_p": 0.8,
    "repetition_penalty": 1.05,
    "seed": None,
}
TOKEN2WAV_DEFAULTS: dict[str, Any] = {"seed": 0, "num_steps": 10, "guidance_scale": 0.5, "sway_coefficient": -1.0}
#: held while a stage loads: stages placed in threads of one process load at the same time, and
#: transformers' lazy imports, its logging switches and the default dtype it sets while it builds
#: a model are all process-wide
_LOADING = threading.Lock()

_THINKER_EMBEDDINGS = "thinker.model.embed_tokens.weight"


def _params(stage: str, params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``params`` over ``defaults``; an unknown name is an error (a typo is never ignored)."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ChatRequestError(
            f"stage {stage!r} takes no parameter(s) {unknown}; it takes {', '.join(sorted(defaults))}",
            field=f"stage_params.{stage}",
        )
    merged = {**defaults, **{k: v for k, v in params.items() if v is not None}}
    for name in ("max_tokens", "top_k", "seed", "num_steps"):
        if merged.get(name) is not None and (not isinstance(merged[name], int) or isinstance(merged[name], bool)):
            raise ChatRequestError(
                f"stage {stage!r}: {name} must be an integer, got {merged[name]!r}",
                field=f"stage_params.{stage}.{name}",
            )
    if merged.get("max_tokens") is not None and merged["max_tokens"] < 1:
        raise ChatRequestError(
            f"stage {stage!r}: max_tokens must be at least 1, got {merged['max_tokens']}",
            field=f"stage_params.{stage}.max_tokens",
        )
    return merged


def _stop_strings(stop: Any) -> tuple[str, ...]:
    """The ``stop`` parameter: a string or a list of strings, none empty."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ChatRequestError(
            f"stop must be a non-empty string or a list of them, got {stop!r}", field="stage_params.thinker.stop"
        )
    return tuple(stops)


def _device(stage: Any, options: dict[str, Any]) -> torch.device:
    """``options["device"]``, else the stage's first device on this process's platform (the
    platform answers, not torch: the CPU where there is no accelerator)."""
    if options.get("device"):
        return torch.device(str(options["device"]))
    from omni_core.platforms import current_platform

    first = str(getattr(stage, "devices", "0") or "0").split(",")[0].strip() or "0"
    device: torch.device = current_platform().device(int(first) if first.isdigit() else 0)
    return device


def _dtype(options: dict[str, Any]) -> Any:
    """``options["dtype"]`` (``float32``, ``bfloat16``, ``float16``), else the checkpoint's own."""
    name = options.get("dtype", "auto")
    if name == "auto":
        return "auto"
    if not isinstance(name, str) or not isinstance(getattr(torch, name, None), torch.dtype):
        raise ModelLoadError(f"engine option dtype {name!r} is not a torch dtype (float32, bfloat16, float16) or auto")
    return getattr(torch, name)


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers reports every weight of the other parts as unexpected when a part loads from
    the whole checkpoint, and warns that the talker's text-marker ids lie outside its codec
    vocabulary (they are thinker ids, by design): expected here, so not shown; nor is the
    loading bar of a stage process."""
    from transformers.utils import logging as hf_logging

    with _LOADING:
        level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)
            if bar:
                hf_logging.enable_progress_bar()


def _load_speakers(model_dir: Path) -> dict[str, dict[str, Any]]:
    """``spk_dict.pt``: voice name -> ``bos_token``, ``cond``, ``ref_mel`` (tensors only)."""
    path = model_dir / "spk_dict.pt"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a Qwen2.5-Omni checkpoint holds its voices in spk_dict.pt")
    speakers: dict[str, dict[str, Any]] = torch.load(path, weights_only=True, map_location="cpu")
    return speakers


def _default_voice(speakers: dict[str, Any], options: dict[str, Any]) -> str:
    voice = options.get("voice") or (DEFAULT_VOICE if DEFAULT_VOICE in speakers else next(iter(speakers)))
    _check_voice(voice, speakers)
    return str(voice)


def _check_voice(voice: Any, speakers: dict[str, Any]) -> None:
    if voice not in speakers:
        raise ChatRequestError(
            f"unknown voice {voice!r}; this checkpoint's voices are {', '.join(sorted(speakers))}", field="voice"
        )


def _cache_kwarg(model: Any) -> str:
    """The name ``forward`` takes the KV cache under (transformers renames ``past_key_values``)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


class ThinkerStage(StageEngine):
    """The thinker: ``Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(model_dir)``,
    which loads only the thinker's weights of the checkpoint.

    Params: ``max_tokens`` (1024), ``temperature`` (0 or absent: greedy), ``top_p``, ``top_k``,
    ``seed``, ``stop`` (a string or a list: the text ends before the first one, and the talker
    speaks only what comes before the token that completes it). Engine options: ``device``,
    ``dtype``, ``system_prompt`` (put first when a conversation has none and the request asks
    for audio, ``params.outputs``; default Qwen's own, which its talker needs to speak; "" for
    none). A text-only request gets the conversation as sent.

    ``run`` returns ``length`` when ``max_tokens`` ran out, else ``stop`` (the end of its turn,
    a stop string)."""

    def __init__(self, model_dir: Path, stage: Any, options: dict[str, Any]) -> None:
        super().__init__(model_dir, stage, options)
        self.device = _device(stage, options)
        with _quiet_loading():
            from transformers import AutoTokenizer, Qwen2_5OmniThinkerForConditionalGeneration

            model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(self.model_dir, dtype=_dtype(options))
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
        self.audio_token_id = int(self.model.config.audio_token_index)
        self.prompt = Prompter(
            self.model_dir,
            self.tokenizer,
            audio_token_id=self.audio_token_id,
            num_mel_bins=int(self.model.config.audio_config.num_mel_bins),
            system_prompt=options.get("system_prompt", SPEECH_SYSTEM_PROMPT),
        )
        self._cache_kw = _cache_kwarg(self.model)
        self._pending: list[int] = []
        #: the current answer's (token id, its text) in yield order: the text is made in run,
        #: where stop strings are found, and handed out by for_output
        self._texts: deque[tuple[int, str]] = deque()

    # -- decoding ------------------------------------------------------------------------------

    @torch.no_grad()
    def _prefill(self, inputs: dict[str, Any]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The prompt's forward pass, with the positions ``generate`` gives it (text positions,
        then the three rotary sections'), and the offset that continues them."""
        ids = inputs["input_ids"]
        mask = torch.ones_like(ids)
        lengths = inputs.get("feature_attention_mask")
        lengths = lengths.sum(-1) if lengths is not None else None
        rotary, deltas = self.model.get_rope_index(ids, None, None, mask, False, lengths, None)
        text = torch.arange(ids.shape[1], device=ids.device).view(1, 1, -1)
        positions = torch.cat([text, rotary], dim=0)
        output = self.model(
            **inputs,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=True,
        )
        return output, mask, deltas

    @torch.no_grad()
    def _step(self, token: int, cache: Any, mask: torch.Tensor, deltas: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """One token's forward pass; it continues the positions as ``generate`` does."""
        length = mask.shape[1]
        mask = torch.cat([mask, mask.new_ones((1, 1))], dim=1)
        text = torch.full((1, 1, 1), length, dtype=torch.long, device=self.device)
        positions = torch.cat([text, (text + deltas.view(1, 1, 1)).expand(3, 1, 1)], dim=0)
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=True,
            **{self._cache_kw: cache},
        )
        return output, mask

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Generator[Any, None, FinishReason]:
        self._pending = []
        self._texts = deque()
        p = _params(
            "thinker",
            params,
            {
                "max_tokens": THINKER_MAX_TOKENS,
                "temperature": None,
                "top_p": None,
                "top_k": None,
                "seed": None,
                "stop": None,
            },
        )
        stops = StopStrings(_stop_strings(p["stop"]))
        requests = list(inputs)
        if len(requests) != 1:
            raise ChatRequestError(f"the thinker takes one request per run, got {len(requests)} items")
        # the speech system prompt only where speech is asked for (None: not known, as when the
        # stage is called directly: everything, as a pipeline request without outputs asks)
        outputs = getattr(params, "outputs", None) or None
        speech = outputs is None or "audio" in outputs
        model_inputs = {k: v.to(self.device) for k, v in self.prompt(requests[0], speech=speech).items()}
        if "input_features" in model_inputs:
            model_inputs["input_features"] = model_inputs["input_features"].to(self.model.dtype)
        ids = model_inputs["input_ids"]
        sampler = Sampler(
            temperature=p["temperature"], top_k=p["top_k"], top_p=p["top_p"], seed=p["seed"], device=self.device
        )
        output, mask, deltas = self._prefill(model_inputs)
        sequence = ids
        prompt = self._prompt_item(model_inputs, output)
        token = sampler(sequence, output.logits[:, -1, :])
        limit = int(p["max_tokens"])
        for n in range(limit):
            if token in self.eos_ids:  # only the first token gets here: later ones are looked at ahead
                return "stop"
            item: dict[str, Any] = {"token_id": token, "embed": None, "hidden": None, "last": True}
            if n == 0:
                item["prompt"] = prompt
            if n == limit - 1:  # the budget's last token: nothing reads it
                _, stopped = self._text(token, stops, last=True)
                yield item
                return "stop" if stopped else "length"
            output, mask = self._step(token, _cache_of(output), mask, deltas)
            sequence = torch.cat([sequence, sequence.new_tensor([[token]])], dim=1)
            following = sampler(sequence, output.logits[:, -1, :])
            last = following in self.eos_ids
            _, stopped = self._text(token, stops, last=last)
            if stopped:  # the token that completes a stop string ends the answer, and is not spoken
                yield item
                return "stop"
            item["embed"] = output.hidden_states[0][0, -1].cpu()
            item["hidden"] = output.hidden_states[-1][0, -1].cpu()
            item["last"] = last
            yield item
            token = following
        return "stop"

    def _text(self, token: int, stops: StopStrings, *, last: bool) -> tuple[str, bool]:
        """The text ``token`` adds to the answer (kept for :meth:`for_output`), and whether it
        completes a stop string (the text then ends before it)."""
        text, stopped = stops.feed(self._piece(token, last=last), final=last)
        self._texts.append((token, text))
        return text, stopped

    def _piece(self, token: int, *, last: bool) -> str:
        """The token's piece of text: held back ("") while it ends inside a character that spans
        several tokens, given out when the character is complete (or when the answer ends)."""
        self._pending.append(token)
        text: str = self.tokenizer.decode(self._pending, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if text.endswith("\ufffd") and not last:
            return ""
        self._pending = []
        return text

    def _prompt_item(self, inputs: dict[str, Any], output: Any) -> dict[str, Any]:
        """What the talker needs of the prompt; the input embeddings of audio positions are zeroed,
        as ``generate`` zeroes them for its talker."""
        ids = inputs["input_ids"][0]
        embed = output.hidden_states[0][0].clone()
        if "input_features" in inputs:
            embed[ids == self.audio_token_id] = 0
        lengths = inputs.get("feature_attention_mask")
        return {
            "ids": ids.cpu(),
            "embed": embed.cpu(),
            "hidden": output.hidden_states[-1][0].cpu(),
            "audio_feature_lengths": lengths.sum(-1).cpu() if lengths is not None else None,
        }

    def for_output(self, item: Any) -> Any:
        """The token's piece of text, as :meth:`run` made it (stop strings cut out). Pieces are
        held back while they end inside a character that spans several tokens, and given out
        when it is complete (or when the answer ends). An item not from the current answer's
        order is decoded here, on its own stream."""
        token = int(item["token_id"])
        if self._texts and self._texts[0][0] == token:
            return self._texts.popleft()[1]
        self._texts.clear()
        return self._piece(token, last=bool(item.get("last")))

    def close(self) -> None:
        self.model = None


def _thinker_embeddings(model_dir: Path, rows: list[int]) -> torch.Tensor:
    """Rows of the thinker's token embedding table, read from the checkpoint without loading the
    thinker: the talker conditions on the embeddings of its text markers and voices' tokens."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        name = json.loads(index.read_text(encoding="utf-8"))["weight_map"][_THINKER_EMBEDDINGS]
    else:
        name = "model.safetensors"
    with safe_open(str(model_dir / name), framework="pt") as weights:
        table = weights.get_slice(_THINKER_EMBEDDINGS)
        return torch.cat([table[row : row + 1] for row in rows], dim=0)


class TalkerStage(StageEngine):
    """The talker: ``Qwen2_5OmniTalkerForConditionalGeneration.from_pretrained(model_dir)``,
    which loads only the talker's weights, plus a few rows of the thinker's embedding table.

    Params: ``voice`` (a speaker of ``spk_dict.pt``; default Chelsie, the checkpoint's default),
    ``max_tokens`` (4096), ``temperature`` (0.9; 0 is greedy), ``top_k`` (40), ``top_p`` (0.8),
    ``repetition_penalty`` (1.05), ``seed``: ``generate``'s talker defaults. Engine options:
    ``device``, ``dtype``, ``voice`` (the default voice)."""

    def __init__(self, model_dir: Path, stage: Any, options: dict[str, Any]) -> None:
        super().__init__(model_dir, stage, options)
        self.device = _device(stage, options)
        with _quiet_loading():
            from transformers import Qwen2_5OmniTalkerForConditionalGeneration

            model = Qwen2_5OmniTalkerForConditionalGeneration.from_pretrained(self.model_dir, dtype=_dtype(options))
        self.model = model.to(self.device).eval()
        self.speakers = _load_speakers(self.model_dir)
        self.default_voice = _default_voice(self.speakers, options)
        m = self.model
        self.stop_codes = {int(m.codec_eos_token), int(m.codec_pad_token)}  # generate's talker_eos_token_id
        rows = [int(m.text_eos_token), int(m.text_pad_token)] + [int(s["bos_token"]) for s in self.speakers.values()]
        table = _thinker_embeddings(self.model_dir, rows).to(self.device, self.model.dtype)
        self.text_eos, self.text_pad = table[0], table[1]
        self.voice_embeds = dict(zip(self.speakers, table[2:], strict=True))
        self._cache_kw = _cache_kwarg(self.model)

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Generator[Any, None, FinishReason]:
        """The codes of the thinker's reply; returns ``length`` when ``max_tokens`` ran out
        (the speech is cut short), else ``stop``."""
        p = _params("talker", params, {**TALKER_DEFAULTS, "voice": self.default_voice})
        _check_voice(p["voice"], self.speakers)
        items = iter(inputs)
        try:
            first = next(items, None)
            if first is None or first.get("hidden") is None:
                return "stop"  # an answer of at most one token: nothing to speak
            return (yield from self._speak(first, items, p))
        finally:
            for _ in items:  # the thinker may go on after the last code: take its items (backpressure)
                pass

    def _reply(self, items: Iterator[Any]) -> Iterator[torch.Tensor]:
        """The thinker's reply, one vector per talker step as ``generate`` builds it: each read
        token's ``hidden + embed``, then the text end marker, then the pad marker for ever."""
        for item in items:
            if item.get("hidden") is not None:
                yield self._condition(item)
        yield self.text_eos
        while True:
            yield self.text_pad

    def _condition(self, item: dict[str, Any]) -> torch.Tensor:
        hidden = item["hidden"].to(self.device, self.model.dtype)
        return hidden + item["embed"].to(self.device, self.model.dtype)

    def _speak(
        self, first: dict[str, Any], items: Iterator[Any], p: dict[str, Any]
    ) -> Generator[Any, None, FinishReason]:
        m = self.model
        voice = p["voice"]
        sampler = Sampler(
            temperature=p["temperature"],
            top_k=p["top_k"],
            top_p=p["top_p"],
            repetition_penalty=p["repetition_penalty"],
            suppress=[int(m.codec_bos_token)],
            seed=p["seed"],
            device=self.device,
        )
        output, sequence = self._prefill(first, voice)
        reply = self._reply(items)
        limit = int(p["max_tokens"])
        for n in range(limit):
            code = sampler(sequence, output.logits[:, -1, :])
            if code in self.stop_codes:
                return "stop"
            yield {"code": code, "voice": voice} if n == 0 else {"code": code}
            if n == limit - 1:
                return "length"
            sequence = torch.cat([sequence, sequence.new_tensor([[code]])], dim=1)
            output = self._step(code, next(reply), output, sequence.shape[1])
        return "stop"

    @torch.no_grad()
    def _prefill(self, first: dict[str, Any], voice: str) -> tuple[Any, torch.Tensor]:
        """The talker's prompt as ``generate`` builds it: the thinker's prompt (hidden + embed),
        the voice's start token, the first reply token; codec mask tokens, pad, start."""
        m = self.model
        prompt = first["prompt"]
        ids = prompt["ids"].to(self.device)
        length = ids.shape[0]
        voice_token = int(self.speakers[voice]["bos_token"])
        text_ids = torch.cat([ids, ids.new_tensor([voice_token, int(first["token_id"])])])[None]
        codec_ids = torch.cat(
            [
                torch.full((length,), int(m.codec_mask_token), dtype=torch.long, device=self.device),
                torch.tensor([int(m.codec_pad_token), int(m.codec_bos_token)], dtype=torch.long, device=self.device),
            ]
        )[None]
        dtype = m.dtype
        embeds = torch.cat(
            [
                prompt["hidden"].to(self.device, dtype) + prompt["embed"].to(self.device, dtype),
                self.voice_embeds[voice][None],
                self._condition(first)[None],
            ]
        )[None]
        lengths = prompt.get("audio_feature_lengths")
        output = m(
            inputs_embeds=embeds,
            attention_mask=torch.ones_like(codec_ids),
            input_text_ids=text_ids,
            audio_feature_lengths=lengths.to(self.device) if lengths is not None else None,
            use_audio_in_video=False,
            use_cache=True,
        )
        return output, codec_ids

    @torch.no_grad()
    def _step(self, code: int, reply: torch.Tensor, previous: Any, length: int) -> Any:
        ids = torch.tensor([[code]], dtype=torch.long, device=self.device)
        return self.model(
            input_ids=ids,
            attention_mask=torch.ones((1, length), dtype=torch.long, device=self.device),
            thinker_reply_part=reply.view(1, 1, -1),
            use_cache=True,
            **{self._cache_kw: _cache_of(previous)},
        )

    def close(self) -> None:
        self.model = None


class Token2WavStage(StageEngine):
    """Token2wav: ``Qwen2_5OmniToken2WavModel.from_pretrained(model_dir)`` with the checkpoint's
    ``token2wav.`` prefix mapped away (it loads only those weights), always in float32 (as
    ``generate`` runs it).

    Params: ``seed`` (0: the DiT's starting noise), ``num_steps`` (10), ``guidance_scale`` (0.5),
    ``sway_coefficient`` (-1.0). The voice comes from the talker's first item. Engine options:
    ``device``."""

    def __init__(self, model_dir: Path, stage: Any, options: dict[str, Any]) -> None:
        super().__init__(model_dir, stage, options)
        self.device = _device(stage, options)
        with _quiet_loading():
            from transformers import Qwen2_5OmniToken2WavModel

            model = Qwen2_5OmniToken2WavModel.from_pretrained(
                self.model_dir, key_mapping={r"^token2wav\.": ""}, dtype=torch.float32
            )
        self.model = model.to(self.device).float().eval()
        self.speakers = _load_speakers(self.model_dir)

    def run(self, inputs: Iterator[Any], params: dict[str, Any]) -> Iterator[Any]:
        p = _params("token2wav", params, TOKEN2WAV_DEFAULTS)
        codes: list[int] = []
        voice: str | None = None
        for item in inputs:
            codes.append(int(item["code"]))
            voice = voice or item.get("voice")
        if not codes:
            return
        if voice is None:
            raise ModelRuntimeError("the talker's first item names no voice: token2wav reads what the talker emits")
        _check_voice(voice, self.speakers)
        yield self._wave(codes, voice, p)

    @torch.no_grad()
    def _wave(self, codes: list[int], voice: str, p: dict[str, Any]) -> torch.Tensor:
        speaker = self.speakers[voice]
        code = torch.tensor([codes], dtype=torch.long, device=self.device)
        on_cpu = self.device.type == "cpu"
        devices = [] if on_cpu else [self.device.index or 0]
        device_type = None if on_cpu else self.device.type
        with torch.random.fork_rng(devices=devices, device_type=device_type):  # the process's RNGs stay as they were
            torch.manual_seed(int(p["seed"]))
            wave = self.model(
                code,
                conditioning=speaker["cond"].to(self.device).float(),
                reference_mel=speaker["ref_mel"].to(self.device).float(),
                num_steps=int(p["num_steps"]),
                guidance_scale=float(p["guidance_scale"]),
                sway_coefficient=float(p["sway_coefficient"]),
            )
        return wave.reshape(-1).float().cpu()

    def close(self) -> None:
        self.model = None
