"""The ``hf`` backend: a local Hugging Face causal LM (transformers), optionally with LoRA adapters (peft).

The tokenizer's chat template renders the conversation (a plain ``role: content`` layout when it
has none). Sampling is batched: the n samples of a prompt, and the prompts of a batch, go through
``generate`` together in chunks of ``batch_size`` rows. Adapters load, switch and unload at
runtime through transformers' peft integration, leaving the base weights in memory.

Versions: ``<name>@<hash>`` where the hash covers ``config.json`` and the weight files' names and
sizes (cheap, and changes when the weights are re-saved at another size or layout), plus
``+<adapter>@<hash of the adapter's files>`` when an adapter is active.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, set_seed

from services.llm.chat import Completion, Message, SampledTokens, Sampling

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


class HFChatModel:
    backend = "hf"

    def __init__(
        self,
        model_path: str | Path,
        lora_path: str | Path | None = None,
        *,
        name: str | None = None,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        batch_size: int = 16,
    ) -> None:
        self.model_path = Path(model_path)
        self.name = name or self.model_path.name
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(self.model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # decoder-only: generation continues from the right edge
        # transformers types .to() on a loaded model as taking the model itself; it takes a device
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=dtype or (torch.bfloat16 if self.device == "cuda" else torch.float32)
        ).to(self.device)  # type: ignore[arg-type]
        self.model.eval()
        self.base_version = f"{self.name}@{_fingerprint(self.model_path, config_only=True)}"
        self.adapters: dict[str, str] = {}  # name -> version
        self.active_adapter: str | None = None
        self._peft: PeftModel | None = None  # wraps self.model once an adapter is loaded
        self._lock = threading.Lock()  # one generate at a time: the seed is global torch state
        if lora_path is not None:
            self.load_adapter(Path(lora_path).name, lora_path)

    # --- adapters ------------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a peft LoRA adapter under ``name`` and make it the active one."""
        with self._lock:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
                self._peft.eval()
            else:
                if name in self.adapters:
                    self._peft.delete_adapter(name)  # a reload under the same name replaces it
                self._peft.load_adapter(str(path), adapter_name=name)
            self._peft.set_adapter(name)
            self.adapters[name] = f"{name}@{_fingerprint(Path(path), config_only=False)}"
            self.active_adapter = name

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if self._peft is None or name not in self.adapters:
                raise KeyError(f"no adapter named {name!r} is loaded")
            del self.adapters[name]
            if not self.adapters:
                self.model = self._peft.unload()  # LoRA layers out, base weights untouched
                self._peft = None
                self.active_adapter = None
                return
            if self.active_adapter == name:
                self.active_adapter = None  # the base model, not whichever adapter peft picks next
            self._peft.delete_adapter(name)

    def use_model(self, name: str) -> None:
        """Serve ``name``: the base model's name, or a loaded adapter's."""
        with self._lock:
            if name == self.name:
                self.active_adapter = None
            elif name in self.adapters:
                assert self._peft is not None
                self._peft.set_adapter(name)
                self.active_adapter = name
            else:
                raise KeyError(f"unknown model {name!r}; serving {self.name!r} with adapters {sorted(self.adapters)}")

    def _generator(self) -> Any:
        """The base model, or the peft wrapper while adapters are loaded (both ``generate``; typed as
        Any since peft's wrapper forwards the call the type checker cannot see)."""
        return self.model if self._peft is None else self._peft

    @property
    def served_name(self) -> str:
        return self.active_adapter or self.name

    @property
    def version(self) -> str:
        return self._version_of(self.served_name)

    def _version_of(self, name: str) -> str:
        return self.base_version if name == self.name else f"{self.base_version}+{self.adapters[name]}"

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.served_name,
            "model_version": self.version,
            "base_model": self.name,
            "path": str(self.model_path),
            "adapter": self.active_adapter,
            "adapters": sorted(self.adapters),
            "device": self.device,
        }

    # --- sampling ------------------------------------------------------------------------------

    @contextmanager
    def _selected(self, name: str | None) -> Iterator[tuple[str, str]]:
        """Generate as ``name`` (the base model's, an adapter's; None: what is served now), then put
        the served selection back. Yields the served name and version."""
        name = self.served_name if name is None else name
        if name != self.name and name not in self.adapters:
            raise KeyError(f"unknown model {name!r}; serving {self.name!r} with adapters {sorted(self.adapters)}")
        if self._peft is None:
            yield name, self.base_version
        elif name == self.name:
            with self._peft.disable_adapter():  # base weights alone while adapters stay loaded
                yield name, self.base_version
        else:
            self._peft.set_adapter(name)
            try:
                yield name, self._version_of(name)
            finally:
                if self.active_adapter is not None:
                    self._peft.set_adapter(self.active_adapter)

    def render(self, messages: list[Message]) -> str:
        return render_prompt(self.tokenizer, messages)

    def complete(self, messages: list[Message], sampling: Sampling) -> list[Completion]:
        return self.sample([messages], sampling)[0][0]

    def sample(
        self, conversations: list[list[Message]], sampling: Sampling, model_name: str | None = None
    ) -> list[tuple[list[Completion], Usage]]:
        """``sampling.n`` replies to each conversation, with token counts; batched across all of them.
        ``model_name`` picks the base model or a loaded adapter for this call only."""
        prompts = [self.render(c) for c in conversations]
        rows = [p for p in prompts for _ in range(sampling.n)]
        sample = sampling.temperature > 0
        eos = self.tokenizer.eos_token_id
        texts: list[tuple[str, str, int, SampledTokens | None]] = []
        with self._lock, torch.inference_mode(), self._selected(model_name) as (name, version):
            if sampling.seed is not None:
                set_seed(sampling.seed)
            for start in range(0, len(rows), self.batch_size):
                batch = self.tokenizer(
                    rows[start : start + self.batch_size], return_tensors="pt", padding=True, add_special_tokens=False
                ).to(self.device)
                generated = self._generator().generate(
                    **batch,
                    do_sample=sample,
                    max_new_tokens=sampling.max_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=eos,
                    return_dict_in_generate=True,
                    output_logits=sampling.logprobs,
                    # top_k 0: no top-k cut (generate's default keeps 50 tokens), the distribution Sampling names
                    **({"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0} if sample else {}),
                )
                width = batch["input_ids"].shape[1]
                logprobs = _chosen_logprobs(generated, width, sampling.temperature) if sampling.logprobs else None
                for row, tokens in enumerate(generated.sequences[:, width:].tolist()):
                    finished = eos is not None and eos in tokens
                    # the end token is part of what was sampled (and trained on); the text stops before it
                    kept = tokens[: tokens.index(eos) + 1] if finished else tokens
                    body = kept[:-1] if finished else kept
                    texts.append(
                        (
                            str(self.tokenizer.decode(body, skip_special_tokens=True)),
                            "stop" if finished or len(body) < sampling.max_tokens else "length",
                            len(body),
                            SampledTokens(prompt=rows[start + row], completion_ids=kept, logprobs=logprobs[row][: len(kept)])
                            if logprobs is not None
                            else None,
                        )
                    )
        results = []
        for i, prompt in enumerate(prompts):
            mine = texts[i * sampling.n : (i + 1) * sampling.n]
            completions = [
                Completion(text=t, model=name, model_version=version, finish_reason=f, tokens=tokens) for t, f, _, tokens in mine
            ]
            usage = Usage(len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]), sum(k for _, _, k, _ in mine))
            results.append((completions, usage))
        return results


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> str:
    """The prompt text a model sees: its tokenizer's chat template with the assistant turn opened (a
    plain ``role: content`` layout where it has none). The trainer renders the same way."""
    if tokenizer.chat_template:
        try:
            return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        except Exception:  # templates that reject a system turn (raise_exception in Jinja)
            if messages and messages[0]["role"] == "system" and len(messages) > 1:
                merged = [{**messages[1], "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}]
                return render_prompt(tokenizer, merged + messages[2:])
            raise
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _chosen_logprobs(generated: Any, width: int, temperature: float) -> list[list[float]]:
    """Each sampled token's log-probability under the model at the sampling temperature (before top-p:
    the distribution the trainer's ratio uses), per row."""
    chosen = generated.sequences[:, width:]
    logits = torch.stack(generated.logits, dim=1).float() / (temperature if temperature > 0 else 1.0)
    return torch.gather(logits.log_softmax(-1), 2, chosen.unsqueeze(-1)).squeeze(-1).tolist()


def _fingerprint(path: Path, config_only: bool) -> str:
    """A short content hash: the config plus weight names and sizes, or (adapters) every file's bytes."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        if file.suffix == ".json" and (not config_only or file.name == "config.json"):
            digest.update(file.name.encode() + file.read_bytes())
        elif file.suffix in WEIGHT_SUFFIXES:
            digest.update(file.name.encode())
            digest.update(file.read_bytes() if not config_only else str(file.stat().st_size).encode())
    return digest.hexdigest()[:12]
