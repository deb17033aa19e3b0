#!/usr/bin/env python3
"""Writes a tiny Llama-architecture GGUF with random weights and the numpy reference of its decode.

Usage: make_tiny_llama.py OUT_DIR [--dtype f32|f16|bf16|q8_0|q4_0] [--tied] [--no-freq-base]
                            [--scaling-type TYPE] [--scaling-factor F] [--rope-freqs]
                            [--layers N] [--hidden N] [--heads N] [--kv-heads N] [--ff N]
                            [--vocab N] [--context N]

Writes OUT_DIR/tiny-llama.gguf with the `gguf` package from PyPI (llama.cpp's own writer), so the
host reads a file it did not write itself, and OUT_DIR/tiny-llama.reference.json: the prompt, the
16 greedily decoded tokens and, for each of them, the 256 logits it was chosen from, computed here
with numpy in float32.

The model: 2 layers, hidden size 64, 4 query heads and 2 key/value heads of 16 (grouped-query
attention), vocabulary 256, SwiGLU feed-forward of 128, RMSNorm (eps 1e-5), RoPE (base 10000,
adjacent pairs rotated, as GGML's normal mode for the llama architecture), weights drawn from a
fixed seed. The tensor names and metadata keys are the standard llama ones.

--layers, --hidden, --heads, --kv-heads, --ff, --vocab and --context replace those sizes (the
head size is hidden / heads, which must be even; the vocabulary must hold the prompt's tokens,
so at least 112), for a model large enough to measure a decode against the machine's memory
bandwidth (crates/app/benches/decode_bound.rs). The weights are drawn the same way in the same
order; without these options the file and the reference are byte-identical to before.

--dtype (default f32) is the storage type of the weight matrices: token_embd, the attention and
feed-forward projections and output. The norm vectors stay f32, as in the files llama.cpp writes.
The matrices are drawn in f32 exactly as for the f32 file (same seed, same order) and stored with
the gguf package's own converters (gguf.quants.quantize: round to nearest for f16, round to
nearest even for bf16, GGML's reference quantizers for q8_0 and q4_0); the default writes the
same bytes as before the option existed. Only the file type key and the matrices differ.

The reference computes what the format defines: each stored matrix is dequantized with
gguf.quants.dequantize (q8_0: d * q; q4_0: d * (nibble - 8); f16/bf16 widened exactly) and the
decode runs in float32 on those values with f32 activations. llama.cpp's CPU backend
additionally rounds the activation vector to Q8_0 (for q8_0 and q4_0 weights) or to f16 (for f16
weights) before its dot products; this reference does not, so it matches an engine that
multiplies the dequantized weights with f32 activations, as the example module does.

The arithmetic (what the C module example.llama.* must match):
  x = token_embd[token]
  per layer:  h = rmsnorm(x) * attn_norm;  q = Wq h, k = Wk h, v = Wv h;  rope(q), rope(k) at pos;
              append k, v to the cache;  a = softmax(q.k / sqrt(16)) v per head (query head i
              reads key/value head i / 2);  x += Wo a
              h = rmsnorm(x) * ffn_norm;  x += Wdown (silu(Wgate h) * (Wup h))
  logits = output (rmsnorm(x) * output_norm)
The prompt's tokens are fed one at a time; the logits after its last token choose the first
decoded token, and each decoded token is fed back to choose the next.

Options write the GGUF conventions real files use, and the reference follows llama.cpp's reading
of each (without options the file and the reference are what they always were):
  --tied               no output.weight: token_embd.weight is the output projection too (the
                       one table holds the embedding's values halved: as drawn they make logits
                       so large that one token repeats; halved the tokens vary, no near tie)
  --no-freq-base       no llama.rope.freq_base: the base is llama.cpp's default, 10000
  --scaling-type TYPE  writes llama.rope.scaling.type = TYPE (any string)
  --scaling-factor F   writes llama.rope.scaling.factor = F
      Linear scaling (the type "linear", or no type with a factor, which llama.cpp reads as
      linear) rotates by pos * freq_scale, freq_scale = 1/F in f32; type "none" or no factor
      (or F = 0) does not scale. Any other type (yarn, longrope, ...) has no reference here: the
      file is written without tiny-llama.reference.json, for refusal tests.
  --rope-freqs         writes rope_freqs.weight, HEAD_DIM/2 f32 factors (Llama 3.1's formula
      with an original context of 32 positions, so that this tiny model's few positions see
      factors from 1 to 8); each pair's angle is divided by its factor, as llama.cpp's rope with
      freq_factors does.

Exit status 3 means the gguf or numpy package is missing (callers skip, unless told to fail).
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import gguf
except ImportError as e:
    print(f"missing Python package: {e}", file=sys.stderr)
    sys.exit(3)

SEED = 19
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 128
N_VOCAB = 256
N_CTX = 64
EPS = 1e-5
ROPE_BASE = 10000.0
PROMPT = [1, 72, 101, 108, 108, 111]
N_DECODE = 16

f32 = np.float32

# The storage types --dtype accepts: the GGML type's name and GGUF's file type
# (general.file_type, llama.cpp's LlamaFileType numbering) for each. Names, not the package's
# enums, so that an older gguf package still writes the default f32 file.
Q = gguf.GGMLQuantizationType
DTYPES = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
}


def apply_shape(args):
    """Replaces the sizes above with the command line's (the functions below read these names)."""
    global N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB, N_CTX
    N_LAYER, N_EMBD, N_HEAD = args.layers, args.hidden, args.heads
    N_HEAD_KV, N_FF, N_VOCAB, N_CTX = args.kv_heads, args.ff, args.vocab, args.context
    problems = []
    if min(N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB, N_CTX) < 1:
        problems.append("every size must be at least 1")
    elif N_EMBD % N_HEAD or (N_EMBD // N_HEAD) % 2:
        problems.append(f"--hidden {N_EMBD} must split into --heads {N_HEAD} heads of an even size")
    elif N_HEAD % N_HEAD_KV:
        problems.append(f"--heads {N_HEAD} must be a multiple of --kv-heads {N_HEAD_KV}")
    if N_VOCAB <= max(PROMPT):
        problems.append(f"--vocab {N_VOCAB} must hold the prompt's tokens (at least {max(PROMPT) + 1})")
    if N_CTX < len(PROMPT) + N_DECODE:
        problems.append(f"--context {N_CTX} must hold the {len(PROMPT) + N_DECODE} positions decoded")
    if problems:
        raise SystemExit("make_tiny_llama.py: " + "; ".join(problems))
    HEAD_DIM = N_EMBD // N_HEAD


def make_weights():
    rng = np.random.default_rng(SEED)

    def mat(rows, cols):
        # numpy (rows, cols) = (out, in); GGUF stores ne = [in, out], in innermost.
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(f32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(f32)

    t = {"token_embd.weight": rng.standard_normal((N_VOCAB, N_EMBD)).astype(f32)}
    for layer in range(N_LAYER):
        p = f"blk.{layer}."
        t[p + "attn_norm.weight"] = norm(N_EMBD)
        t[p + "attn_q.weight"] = mat(N_HEAD * HEAD_DIM, N_EMBD)
        t[p + "attn_k.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[p + "attn_v.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[p + "attn_output.weight"] = mat(N_EMBD, N_HEAD * HEAD_DIM)
        t[p + "ffn_norm.weight"] = norm(N_EMBD)
        t[p + "ffn_gate.weight"] = mat(N_FF, N_EMBD)
        t[p + "ffn_up.weight"] = mat(N_FF, N_EMBD)
        t[p + "ffn_down.weight"] = mat(N_EMBD, N_FF)
    t["output_norm.weight"] = norm(N_EMBD)
    t["output.weight"] = mat(N_VOCAB, N_EMBD)
    return t


def is_matrix(name):
    """The weight matrices --dtype applies to (the norm vectors are 1-D and stay f32)."""
    return name.endswith(".weight") and not name.endswith("norm.weight")


def store(t, qtype):
    """The tensors as the file stores them: the matrices converted to qtype by the gguf package."""
    if qtype == Q.F32:
        return dict(t)
    return {name: gguf.quants.quantize(v, qtype) if is_matrix(name) else v for name, v in t.items()}


def stored_values(stored, qtype):
    """What the format defines the stored tensors to be: the matrices dequantized to float32."""
    if qtype == Q.F32:
        return stored
    out = {}
    for name, v in stored.items():
        if is_matrix(name):
            out[name] = gguf.quants.dequantize(v, qtype).astype(f32, copy=False)
        else:
            out[name] = v
    return out


def rope_factors():
    """Llama 3.1's rope_freqs (factor 8, low/high frequency factors 1 and 4) for HEAD_DIM and
    ROPE_BASE, over an original context of 32 positions instead of 8192."""
    factor, low, high, orig = 8.0, 1.0, 4.0, 32.0
    out = []
    for i in range(HEAD_DIM // 2):
        freq = ROPE_BASE ** (-2.0 * i / HEAD_DIM)
        wavelen = 2.0 * np.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=f32)


class Conventions:
    """What the options ask for; the defaults write the file as it always was."""

    def __init__(self, args=None):
        self.tied = bool(args and args.tied)
        self.freq_base = not (args and args.no_freq_base)
        self.scaling_type = args.scaling_type if args else None
        self.scaling_factor = args.scaling_factor if args else None
        self.rope_freqs = rope_factors() if args and args.rope_freqs else None

    def freq_scale(self):
        """llama.cpp's freq_scale, or None for a scaling type this reference does not compute."""
        kind = "linear" if self.scaling_type is None else self.scaling_type
        if kind == "none" or not self.scaling_factor:
            return f32(1.0) if kind in ("none", "linear") else None
        if kind != "linear":
            return None
        return f32(1.0) / f32(self.scaling_factor)


def write_gguf(path, t, qtype, file_type, conv=None):
    conv = conv or Conventions()
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("guild tiny llama (random weights)")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    if conv.freq_base:
        w.add_rope_freq_base(ROPE_BASE)
    if conv.scaling_type is not None:
        w.add_string(gguf.Keys.Rope.SCALING_TYPE.format(arch="llama"), conv.scaling_type)
    if conv.scaling_factor is not None:
        w.add_rope_scaling_factor(conv.scaling_factor)
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(file_type)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<0x{i:02X}>" for i in range(N_VOCAB)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, value in t.items():
        if qtype in (Q.F32, Q.F16) or not is_matrix(name):
            w.add_tensor(name, value)
        else:
            # The quantizer's bytes, one row of blocks per matrix row; the writer derives the
            # element shape from the byte shape and the type.
            w.add_tensor(name, value, raw_dtype=qtype)
    if conv.rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", conv.rope_freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rmsnorm(x, weight):
    return (x / np.sqrt(np.mean(x * x, dtype=f32) + f32(EPS))).astype(f32) * weight


def rope(x, pos, freq_scale=None, factors=None):
    # x: (heads, HEAD_DIM); pairs (2i, 2i+1) rotate by pos * base^(-2i / HEAD_DIM), times
    # freq_scale and divided by factors[i] when given (in float64, as the module does).
    i = np.arange(HEAD_DIM // 2, dtype=np.float64)
    theta = pos * ROPE_BASE ** (-2.0 * i / HEAD_DIM)
    if freq_scale is not None:
        theta = pos * np.float64(freq_scale) * ROPE_BASE ** (-2.0 * i / HEAD_DIM)
    if factors is not None:
        theta = theta / factors.astype(np.float64)
    cos, sin = np.cos(theta).astype(f32), np.sin(theta).astype(f32)
    x0, x1 = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2] = x0 * cos - x1 * sin
    out[:, 1::2] = x0 * sin + x1 * cos
    return out


def decode(t, conv=None):
    conv = conv or Conventions()
    # Without output.weight (tied embeddings) token_embd.weight is the output projection.
    freq_scale = conv.freq_scale()
    if freq_scale == f32(1.0):
        freq_scale = None  # exactly the unscaled arithmetic
    factors = conv.rope_freqs
    output = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    k_cache = np.zeros((N_LAYER, N_CTX, N_HEAD_KV, HEAD_DIM), dtype=f32)
    v_cache = np.zeros_like(k_cache)
    group = N_HEAD // N_HEAD_KV
    scale = f32(1.0 / np.sqrt(HEAD_DIM))

    def step(token, pos):
        x = t["token_embd.weight"][token].copy()
        for layer in range(N_LAYER):
            p = f"blk.{layer}."
            h = rmsnorm(x, t[p + "attn_norm.weight"])
            q = rope((t[p + "attn_q.weight"] @ h).reshape(N_HEAD, HEAD_DIM), pos, freq_scale, factors)
            k = rope((t[p + "attn_k.weight"] @ h).reshape(N_HEAD_KV, HEAD_DIM), pos, freq_scale, factors)
            v = (t[p + "attn_v.weight"] @ h).reshape(N_HEAD_KV, HEAD_DIM)
            k_cache[layer, pos] = k
            v_cache[layer, pos] = v
            a = np.empty((N_HEAD, HEAD_DIM), dtype=f32)
            for head in range(N_HEAD):
                kv = head // group
                s = (k_cache[layer, : pos + 1, kv] @ q[head]) * scale
                e = np.exp(s - s.max())
                a[head] = (e / e.sum()) @ v_cache[layer, : pos + 1, kv]
            x = x + t[p + "attn_output.weight"] @ a.reshape(-1)
            h = rmsnorm(x, t[p + "ffn_norm.weight"])
            g = t[p + "ffn_gate.weight"] @ h
            u = t[p + "ffn_up.weight"] @ h
            x = x + t[p + "ffn_down.weight"] @ ((g / (f32(1.0) + np.exp(-g))) * u)
        return output @ rmsnorm(x, t["output_norm.weight"])

    logits = None
    for pos, token in enumerate(PROMPT):
        logits = step(token, pos)
    tokens, all_logits, margins = [], [], []
    pos = len(PROMPT)
    for n in range(N_DECODE):
        token = int(np.argmax(logits))
        top2 = np.sort(logits)[-2:]
        tokens.append(token)
        all_logits.append([float(v) for v in logits])
        margins.append(float(top2[1] - top2[0]))
        if n + 1 < N_DECODE:
            logits = step(token, pos)
            pos += 1
    return tokens, all_logits, min(margins)


def main():
    parser = argparse.ArgumentParser(description="Writes the tiny Llama GGUF and its reference.")
    parser.add_argument("out_dir")
    parser.add_argument("--dtype", choices=list(DTYPES), default="f32",
                        help="how the weight matrices are stored (norm vectors stay f32)")
    parser.add_argument("--tied", action="store_true", help="omit output.weight")
    parser.add_argument("--no-freq-base", action="store_true", help="omit llama.rope.freq_base")
    parser.add_argument("--scaling-type", help="write llama.rope.scaling.type")
    parser.add_argument("--scaling-factor", type=float, help="write llama.rope.scaling.factor")
    parser.add_argument("--rope-freqs", action="store_true", help="write rope_freqs.weight")
    parser.add_argument("--layers", type=int, default=N_LAYER, help="llama.block_count")
    parser.add_argument("--hidden", type=int, default=N_EMBD, help="llama.embedding_length")
    parser.add_argument("--heads", type=int, default=N_HEAD, help="llama.attention.head_count")
    parser.add_argument("--kv-heads", type=int, default=N_HEAD_KV,
                        help="llama.attention.head_count_kv")
    parser.add_argument("--ff", type=int, default=N_FF, help="llama.feed_forward_length")
    parser.add_argument("--vocab", type=int, default=N_VOCAB, help="the vocabulary's size")
    parser.add_argument("--context", type=int, default=N_CTX, help="llama.context_length")
    args = parser.parse_args()
    apply_shape(args)
    conv = Conventions(args)
    out, dtype = args.out_dir, args.dtype
    if dtype in ("q8_0", "q4_0") and (N_EMBD % 32 or N_FF % 32):
        raise SystemExit(f"make_tiny_llama.py: {dtype} stores rows of 32-element blocks; --hidden "
                         f"{N_EMBD} and --ff {N_FF} must be multiples of 32")
    type_name, file_type = DTYPES[dtype]
    t = make_weights()
    if conv.tied:
        # One table for both ends, in the position token_embd.weight had (file order kept).
        t = {
            name: ((value / f32(2.0)).astype(f32) if name == "token_embd.weight" else value)
            for name, value in t.items()
            if name != "output.weight"
        }
    try:
        qtype = Q[type_name]
        stored = store(t, qtype)
        values = stored_values(stored, qtype)
    except (KeyError, AttributeError, NotImplementedError) as e:
        # Exit status 3, as for a missing package: callers skip, unless told to fail.
        print(f"missing Python package: this gguf package cannot convert to {dtype} ({e!r}); "
              "a newer one can (python3 -m pip install -U gguf)", file=sys.stderr)
        return 3
    os.makedirs(out, exist_ok=True)
    write_gguf(os.path.join(out, "tiny-llama.gguf"), stored, qtype, file_type, conv)
    if conv.freq_scale() is None:
        print(
            f"wrote {out}/tiny-llama.gguf with llama.rope.scaling.type = {conv.scaling_type}, "
            "which this reference does not compute: no reference written"
        )
        return 0
    tokens, logits, margin = decode(values, conv)
    reference = {
        "prompt": PROMPT,
        "tokens": tokens,
        "logits": logits,
        # The smallest gap between the best and second-best logit over the decoded steps: a
        # tolerance on the logits below it means equal tokens are not luck.
        "min_top2_margin": margin,
    }
    with open(os.path.join(out, "tiny-llama.reference.json"), "w") as f:
        json.dump(reference, f)
    print(f"wrote {out}/tiny-llama.gguf ({dtype} weights) and tiny-llama.reference.json: tokens {tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
