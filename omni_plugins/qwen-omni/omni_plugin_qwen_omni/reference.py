"""What transformers computes for a request, to check the stages against: the text tokens, the
codec codes and the waveform of ``Qwen2_5OmniForConditionalGeneration.generate`` (the whole model
in one process, greedy thinker and talker), and the same three from the stage engines called one
after the other in this process.

The prompt is built here the way the thinker builds it (:mod:`.prompt`); a test of the prompt
itself compares against the tokenizer's chat template directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Answer:
    """One request's answer: text token ids (without the end-of-turn token), codec codes (without
    the stop code), the waveform (1-D float32, or None when nothing was spoken) and, from the
    stages only, the text pieces a client gets."""

    tokens: list[int]
    codes: list[int]
    wave: torch.Tensor | None
    pieces: list[str] | None = None


def generate(
    model_dir: Path | str,
    request: Any,
    *,
    thinker_max_tokens: int,
    talker_max_tokens: int,
    voice: str = "Chelsie",
    seed: int = 0,
    restore_talker_mask: bool = True,
) -> Answer:
    """``Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir).generate(...)`` with greedy
    thinker and talker, the checkpoint's end-of-turn ids and stop codes, and ``seed`` set just
    before it (the only random draw of a greedy run is token2wav's starting noise).

    One correction: transformers 5's ``generate`` drops an attention mask of all ones before the
    first forward pass, and the talker's forward sets its prompt up only when it gets one (it adds
    the codec start and pad embeddings to the prompt's last two positions and computes the
    multimodal rotary positions). The released model always had them (transformers 4's
    ``generate`` passed the mask), and so do the stages; here a hook gives the talker the mask back
    (``restore_talker_mask=False``: ``generate`` exactly as installed)."""
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    from omni_plugin_qwen_omni.prompt import SPEECH_SYSTEM_PROMPT, Prompter

    model_dir = Path(model_dir)
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir).eval()
    config = model.config.thinker_config
    prompter = Prompter(
        model_dir,
        AutoTokenizer.from_pretrained(model_dir),
        audio_token_id=int(config.audio_token_index),
        num_mel_bins=int(config.audio_config.num_mel_bins),
        system_prompt=SPEECH_SYSTEM_PROMPT,
    )
    inputs = prompter(request)
    eos = thinker_eos(model_dir)
    captured: dict[str, list[int]] = {}

    def capture(module: Any, args: Any, kwargs: Any) -> None:
        captured["codes"] = args[0][0].tolist()

    def give_mask(module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if kwargs.get("attention_mask") is None:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            done = cache.get_seq_length() if cache is not None else 0
            new = (kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else kwargs["input_ids"]).shape[1]
            kwargs["attention_mask"] = torch.ones((1, done + new), dtype=torch.long)
        return args, kwargs

    hooks = [model.token2wav.register_forward_pre_hook(capture, with_kwargs=True)]
    if restore_talker_mask:
        hooks.append(model.talker.register_forward_pre_hook(give_mask, with_kwargs=True))
    try:
        torch.manual_seed(seed)
        sequences, wave = model.generate(
            **inputs,
            speaker=voice,
            thinker_max_new_tokens=thinker_max_tokens,
            thinker_do_sample=False,
            thinker_eos_token_id=eos,
            talker_do_sample=False,
            talker_max_new_tokens=talker_max_tokens,
            talker_eos_token_id=[model.talker.codec_pad_token, model.talker.codec_eos_token],
        )
    finally:
        for hook in hooks:
            hook.remove()
    tokens = sequences[0, inputs["input_ids"].shape[1] :].tolist()
    if tokens and tokens[-1] in eos:
        tokens = tokens[:-1]
    return Answer(tokens=tokens, codes=captured.get("codes", []), wave=wave.reshape(-1).float())


class StageChain:
    """The three stage engines, loaded once, called in sequence in this process (their ``run``
    methods, each consuming the previous one's items) as the pipeline runs them."""

    def __init__(self, model_dir: Path | str) -> None:
        from omni_plugin_qwen_omni.model import QwenOmni
        from omni_plugin_qwen_omni.stages import TalkerStage, ThinkerStage, Token2WavStage

        model_dir = Path(model_dir)
        defs = {s.name: s for s in QwenOmni.topology_for(model_dir).stages}
        self.thinker = ThinkerStage(model_dir, defs["thinker"], {})
        self.talker = TalkerStage(model_dir, defs["talker"], {})
        self.token2wav = Token2WavStage(model_dir, defs["token2wav"], {})

    def __call__(self, request: Any, params: dict[str, dict[str, Any]] | None = None) -> Answer:
        params = params or {}
        items = list(self.thinker.run(iter([request]), params.get("thinker", {})))
        pieces = [self.thinker.for_output(item) for item in items]
        codes = list(self.talker.run(iter(items), params.get("talker", {})))
        waves = list(self.token2wav.run(iter(codes), params.get("token2wav", {})))
        return Answer(
            tokens=[int(i["token_id"]) for i in items],
            codes=[int(c["code"]) for c in codes],
            wave=waves[0] if waves else None,
            pieces=pieces,
        )


def stages(model_dir: Path | str, request: Any, params: dict[str, dict[str, Any]] | None = None) -> Answer:
    """One request through a fresh :class:`StageChain`."""
    return StageChain(model_dir)(request, params)


def thinker_eos(model_dir: Path | str) -> list[int]:
    """The thinker's end-of-turn ids: the checkpoint's ``generation_config.json``, as
    ``Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained`` reads them."""
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
