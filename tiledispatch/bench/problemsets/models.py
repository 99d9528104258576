"""Layer sizes of public language models: the shapes their GEMMs and attention pose.

Figures are each model's published config (hidden size, MLP width, heads, key/value heads,
head dim, vocabulary); a `-tp8` entry is the model's attention split over 8 GPUs by tensor
parallelism, as a serving engine runs it. The tiny entries scale the same layers down to
sizes the CPU interpreter runs in a test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transformer:
    """A decoder's dense layers: every Linear's (out, in) follows from these."""

    name: str
    hidden: int
    intermediate: int  # the MLP's width (each of gate and up where gated)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qkv_bias: bool = False  # Qwen2: biased q, k, v projections
    bias: bool = False  # GPT-style: every Linear biased
    gated: bool = True  # SwiGLU/GeGLU MLP (gate and up); else one up projection with a fused GELU
    window: int = 0  # sliding-window attention (Mistral, Gemma 2's local layers); 0: none
    head_dim_v: int = 0  # the value head dim where it differs (DeepSeek's MLA prefill); 0: head_dim
    causal: bool = True  # a decoder; False: an encoder (ViT), whose attention sees every token

    def linears(self) -> tuple[tuple[str, int, int, bool, str], ...]:
        """(layer, out features, in features, bias, fused activation) of each Linear, fused and split
        as frameworks pose them: vLLM fuses q, k, v; Hugging Face runs q and k/v apart."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = (("gate_up", 2 * self.intermediate, self.hidden, self.bias, "none"),
               ("gate", self.intermediate, self.hidden, self.bias, "none")) if self.gated else (
            ("fc1", self.intermediate, self.hidden, self.bias, "gelu"),)
        return (("qkv", q + 2 * kv, self.hidden, self.bias or self.qkv_bias, "none"),
                ("q", q, self.hidden, self.bias or self.qkv_bias, "none"),
                ("kv", kv, self.hidden, self.bias or self.qkv_bias, "none"),
                ("o", self.hidden, q, self.bias, "none"),
                *mlp,
                ("down", self.hidden, self.intermediate, self.bias, "none"),
                ("lm_head", self.vocab, self.hidden, False, "none"))


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts layer: routed experts (each a gated MLP), the router, shared experts."""

    name: str
    hidden: int
    expert_intermediate: int
    experts: int
    top_k: int
    shared_intermediate: int = 0  # the shared experts' total width; 0: none


LLMS = (
    Transformer("llama2-7b", 4096, 11008, 32, 32, 128, 32000),
    Transformer("llama3-8b", 4096, 14336, 32, 8, 128, 128256),
    Transformer("llama3-70b", 8192, 28672, 64, 8, 128, 128256),
    Transformer("mistral-7b", 4096, 14336, 32, 8, 128, 32000, window=4096),
    Transformer("qwen2.5-0.5b", 896, 4864, 14, 2, 64, 151936, qkv_bias=True),
    Transformer("qwen2.5-7b", 3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
    Transformer("gemma-2b", 2048, 16384, 8, 1, 256, 256000),
    Transformer("gemma2-9b", 3584, 14336, 16, 8, 256, 256000, window=4096),
    Transformer("phi-2", 2560, 10240, 32, 32, 80, 51200, bias=True, gated=False),
    Transformer("phi-3-mini", 3072, 8192, 32, 32, 96, 32064),
    Transformer("gpt2", 768, 3072, 12, 12, 64, 50257, bias=True, gated=False),
    Transformer("gpt2-xl", 1600, 6400, 25, 25, 64, 50257, bias=True, gated=False),
)

# Attention shapes beyond the dense layers above: tensor-parallel shards and DeepSeek's MLA,
# whose prefill attends with 192-wide query/key heads and 128-wide value heads.
ATTENTION_ONLY = (
    Transformer("llama3-70b-tp8", 8192, 28672, 8, 1, 128, 128256),
    Transformer("llama2-7b-tp8", 4096, 11008, 4, 4, 128, 32000),
    Transformer("deepseek-v3-mla", 7168, 18432, 128, 128, 192, 129280, head_dim_v=128),
    Transformer("vit-small", 384, 1536, 12, 12, 32, 1000, bias=True, gated=False, causal=False),
)

MOES = (
    Moe("mixtral-8x7b", 4096, 14336, 8, 2),
    Moe("mixtral-8x22b", 6144, 16384, 8, 2),
    Moe("deepseek-v2-lite", 2048, 1408, 64, 6, shared_intermediate=2816),
    Moe("deepseek-v3", 7168, 2048, 256, 8, shared_intermediate=2048),
    Moe("qwen1.5-moe-a2.7b", 2048, 1408, 60, 4, shared_intermediate=5632),
    Moe("qwen3-30b-a3b", 2048, 768, 128, 8),
    Moe("olmoe-1b-7b", 2048, 1024, 64, 8),
)

# Tokens per call: decode steps (1..33), small and odd batches, prefill chunks, long prompts.
TOKENS = (1, 3, 7, 16, 33, 100, 255, 384, 1000, 2047, 3000, 4096, 5555, 8192, 12000, 16384)
TRAINING_TOKENS = (1000, 2047, 4096, 5555, 8192, 16384)

TINY_LLMS = (
    Transformer("tiny", 64, 96, 2, 1, 32, 100, qkv_bias=True),
    Transformer("tiny-gpt", 32, 64, 1, 1, 32, 50, bias=True, gated=False),
)
TINY_MOES = (Moe("tiny-moe", 32, 48, 4, 2, shared_intermediate=32),)
TINY_TOKENS = (1, 17)
