"""Tiny causal LMs built offline (no model hub needed): a byte-level BPE tokenizer trained on a few
lines, with a chat template and special tokens, and a 2-layer Llama, random or fitted to answer one
prompt with one reply some of the time. Seconds to build, milliseconds per token on CPU: what the
quickstart's loop trains (``kernelzero train tiny-model``) and what the tests sample from."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n",
    "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n",
    "def forward(self, x):\n    return torch.relu(x)\n",
    "@triton.jit\ndef kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    pid = tl.program_id(0)\n",
    "You are an expert GPU kernel engineer. Write a fast custom kernel for the architecture.",
    "```python\nprint('hello world')\n```\n",
]


def build_tiny_lm(directory: Path, vocab_size: int = 400, seed: int = 0) -> Path:
    """Save a tokenizer and a random 2-layer Llama under ``directory``; return it."""
    _random_llama(build_tokenizer(directory, vocab_size), seed, max_positions=8192).save_pretrained(directory)
    return directory


def build_tokenizer(directory: Path, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE on a few lines of kernel code, with the chat template, saved under ``directory``."""
    return _save_tokenizer(directory, CORPUS * 4, vocab_size, split_words=True)


def _save_tokenizer(directory: Path, corpus: list[str], vocab_size: int, *, split_words: bool) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus``, with the chat template and special tokens; merges cross
    word boundaries unless ``split_words``."""
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|end|>", pad_token="<|pad|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return tokenizer


def _random_llama(tokenizer: PreTrainedTokenizerFast, seed: int, max_positions: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def build_replying_lm(directory: Path, messages: list[dict[str, str]], reply: str, chance: float = 0.4, seed: int = 0) -> Path:
    """A tiny model that answers ``messages`` with ``reply`` about ``chance`` of the time at
    temperature 1 (something else, no program, otherwise): a policy whose groups carry a signal
    and whose reward RL can raise. Its tokenizer's merges cross word boundaries, so the prompt and
    the reply are a few tokens each and sampling takes milliseconds."""
    tokenizer = _save_tokenizer(directory, [m["content"] for m in messages] * 8 + [reply] * 8, 2000, split_words=False)
    model = _random_llama(tokenizer, seed, max_positions=512)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(reply + "<|end|>", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + reply_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(500):  # up the reply's likelihood until it is sampled about `chance` of the time
        loss = model(input_ids=ids, labels=labels).loss * len(reply_ids)  # the reply's negative log-likelihood
        if float(torch.exp(-loss.detach())) >= chance:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(directory)
    return directory
