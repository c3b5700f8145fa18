#!/usr/bin/env python3
"""Golden fixtures for qforge's reference engine: tiny Qwen3.5-MoE models and what transformers
computes with them.

    pip install torch transformers==5.17.* safetensors tokenizers
    python3 tests/golden/make_model_goldens.py OUTDIR [--qforge BUILD/bin/qforge]

For each model shape below this script
  1. trains a small byte-level BPE tokenizer with HF `tokenizers` (Qwen3.5's split regex, NFC,
     its special tokens), shared by all models (tokenizer.json, generation_config.json);
  2. builds Qwen3_5MoeForConditionalGeneration with the shape's text config, randomizes every
     parameter (norm weights, A_log, dt_bias, conv, router too, not the default init) and saves
     the text model in Qwen's release layout: BF16, A_log and linear_attn.norm F32, fused routed
     experts, plus a random MTP head with per-expert experts (as Qwen3.5's release stores it);
     the vision tower is left out;
  3. reloads the saved checkpoint in float32 and records, in reference.safetensors:
       prompt_ids  [T]      the tokenized prompt (T >= 40)
       logits      [T, V]   fp32 logits at every position (one forward over the prompt)
       greedy_ids  [N]      greedy continuation (N = 24) through transformers' KV/state cache
       mtp_logits  [T-1, V] the MTP head's logits for positions t + 2, t = 0..T-2, computed from
                            qwen35-architecture.md §5.2 with transformers' own decoder layer,
                            norms and rotary embedding (transformers has no MTP class)
     and checks that no argmax is a near tie (top-1 minus top-2 >= 2e-4 * max|logit|, 20x the
     engine's error) so that
     exact-argmax comparisons are meaningful; a shape's seed is bumped until that holds;
  4. with --qforge: quantizes the model the way the Spark recipe does (synth --from to Intel INT4
     and Qwen FP8, build-hybrid, quantize-lm-head to INT8), runs `qforge dequantize --dtype f32`
     on that hybrid and records the same references from transformers on the dequantized copy.
     The hybrid itself is not kept: the tests rebuild it with the same commands (all of them are
     deterministic) and run the engine on it.
Layout: OUT/tokenizer.json, OUT/provenance.json, and per shape OUT/<name>/model/ (checkpoint),
OUT/<name>/reference.safetensors, OUT/<name>/hybrid_reference.safetensors.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import tokenizers
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>", "</tool_response>"]
NON_SPECIAL = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>"}  # Qwen marks these special=false: they appear in decoded text

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. A tiny model still needs words to say.",
    "def forward(self, x):\n    return self.norm(x) + x  # residual\n",
    "Merhaba dünya! İstanbul'da güzel bir gün. Çok teşekkürler, görüşürüz.",
    "你好，世界。今天天气很好。我们一起学习语言模型。",
    "Numbers 0123456789, emoji 😀🚀✨, and whitespace    runs\n\n\tend.",
    "<|im_start|>user\nWhat is a mixture of experts?<|im_end|>\n<|im_start|>assistant\n",
    "Gated DeltaNet layers keep a recurrent state; attention layers keep a KV cache.",
] * 20

PROMPT = ("<|im_start|>user\nExplain, briefly and clearly, how a mixture-of-experts layer routes "
          "each token to its experts. Merhaba! 你好。<|im_end|>\n<|im_start|>assistant\n<think>\n")

# name: text-config overrides. Ratios Nv/Nk 1, 2, 4; head_dim 64 and 256; expert counts and
# top-k vary; vocab sizes are unusual (padded past the tokenizer, as the real 248,320 is): 1031
# is odd, so its hybrid keeps a BF16 LM head (INT8 GPTQ packs 4 rows per qzeros word); the
# others are multiples of 4 only. Every dimension INT4 packs (N and K of quantized modules, Nv
# included) is a multiple of 8.
SHAPES = {
    "r1-hd64-e4k2": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, linear_num_key_heads=8,
                         linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, vocab_size=1031),
    "r2-hd256-e8k3": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=256, linear_num_key_heads=4,
                          linear_num_value_heads=8, linear_key_head_dim=32,
                          linear_value_head_dim=16, num_experts=8, num_experts_per_tok=3,
                          moe_intermediate_size=40, shared_expert_intermediate_size=32,
                          vocab_size=1156),
    "r4-hd64-e16k4": dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                          num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                          linear_num_value_heads=8, linear_key_head_dim=16,
                          linear_value_head_dim=32, num_experts=16, num_experts_per_tok=4,
                          moe_intermediate_size=24, shared_expert_intermediate_size=40,
                          vocab_size=1092, partial_rotary_factor=0.5, rope_theta=10000.0),
}
N_GREEDY = 24


def train_tokenizer(out_dir, texts=TRAIN_TEXT, vocab_size=700):
    """Byte-level BPE of `vocab_size` learned ids on `texts`, then Qwen3.5's specials."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.normalizer = tokenizers.normalizers.NFC()
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(QWEN35_SPLIT), behavior="isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([tokenizers.AddedToken(s, special=False, normalized=False) for s in SPECIALS
                    if s in NON_SPECIAL])
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False)
                            for s in SPECIALS if s not in NON_SPECIAL])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok


def make_config(shape, tok):
    text = dict(shape)
    rope = {"rope_type": "default", "rope_theta": text.pop("rope_theta", 1e7),
            "partial_rotary_factor": text.pop("partial_rotary_factor", 0.25),
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    text.update(rope_parameters=rope, rms_norm_eps=1e-6, max_position_embeddings=4096,
                mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
                eos_token_id=tok.token_to_id("<|im_end|>"), dtype="bfloat16")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=text["hidden_size"])
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


def randomize(model, cfg, gen):
    """Every parameter random at a scale that keeps activations O(1) and routing decisive."""
    for name, p in model.named_parameters():
        if name.startswith("model.visual."):
            continue
        with torch.no_grad():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 8.0, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("linear_attn.norm.weight"):  # plain weight (not 1 + w)
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):  # zero-centred: the gain is 1 + w
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(2.0 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(4.0 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # projections: fan-in scaling (the last dim is the input)
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def mtp_tensors(cfg, gen):
    t = cfg.text_config
    h, e, i, s = t.hidden_size, t.num_experts, t.moe_intermediate_size, t.shared_expert_intermediate_size
    nq, nkv, hd = t.num_attention_heads, t.num_key_value_heads, t.head_dim
    r = lambda *shape: torch.randn(shape, generator=gen) / shape[-1] ** 0.5
    n = lambda k: 0.3 * torch.randn(k, generator=gen)
    out = {"mtp.fc.weight": r(h, 2 * h), "mtp.pre_fc_norm_embedding.weight": n(h),
           "mtp.pre_fc_norm_hidden.weight": n(h), "mtp.norm.weight": n(h)}
    p = "mtp.layers.0."
    out.update({p + "input_layernorm.weight": n(h), p + "post_attention_layernorm.weight": n(h),
                p + "self_attn.q_proj.weight": r(2 * nq * hd, h),
                p + "self_attn.k_proj.weight": r(nkv * hd, h),
                p + "self_attn.v_proj.weight": r(nkv * hd, h),
                p + "self_attn.o_proj.weight": r(h, nq * hd),
                p + "self_attn.q_norm.weight": n(hd), p + "self_attn.k_norm.weight": n(hd),
                p + "mlp.gate.weight": 2.0 * r(e, h),
                p + "mlp.shared_expert.gate_proj.weight": r(s, h),
                p + "mlp.shared_expert.up_proj.weight": r(s, h),
                p + "mlp.shared_expert.down_proj.weight": r(h, s),
                p + "mlp.shared_expert_gate.weight": r(1, h)})
    for x in range(e):
        q = f"{p}mlp.experts.{x}."
        out.update({q + "gate_proj.weight": r(i, h), q + "up_proj.weight": r(i, h),
                    q + "down_proj.weight": r(h, i)})
    return out


def save_release_layout(model, mtp, out_dir):
    """Text model + MTP in Qwen's BF16 release layout (A_log and the gated norm F32); returns
    the tensors saved."""
    tensors = {}
    for name, p in model.state_dict().items():
        if name.startswith("model.visual."):
            continue
        keep_f32 = name.endswith("A_log") or name.endswith("linear_attn.norm.weight")
        tensors[name] = p.detach().to(torch.float32 if keep_f32 else torch.bfloat16).cpu().contiguous()
    for name, p in mtp.items():
        tensors[name] = p.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return tensors


def argmax_margin(logits):
    top = torch.topk(logits.float(), 2, dim=-1).values
    return ((top[..., 0] - top[..., 1]) / logits.abs().amax(dim=-1)).min().item()


def fused_experts(tensors, prefix, n):
    """The per-expert `prefix`mlp.experts.{x}.{gate,up,down}_proj weights as transformers' fused
    gate_up_proj [n, 2I, H] and down_proj [n, H, I], in f32."""
    w = lambda x, k: tensors[f"{prefix}mlp.experts.{x}.{k}_proj.weight"]
    gate_up = torch.stack([torch.cat([w(x, "gate"), w(x, "up")]) for x in range(n)]).float()
    return gate_up, torch.stack([w(x, "down") for x in range(n)]).float()


def mtp_reference(model, tensors, ids, cfg):
    """qwen35-architecture.md §5.2 over the whole prompt, with transformers' building blocks."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
    t = cfg.text_config
    lm = model.model.language_model
    full = next(i for i, k in enumerate(t.layer_types) if k == "full_attention")
    layer = m.Qwen3_5MoeDecoderLayer(t, full).float().eval()
    p = "mtp.layers.0."
    sd = {k[len(p):]: v.float() for k, v in tensors.items() if k.startswith(p) and ".experts." not in k}
    sd["mlp.experts.gate_up_proj"], sd["mlp.experts.down_proj"] = fused_experts(
        tensors, p, t.num_experts)
    layer.load_state_dict(sd, strict=True)
    norm = lambda key: _rmsnorm(t, tensors[key].float())
    with torch.no_grad():
        hidden = lm(input_ids=ids).last_hidden_state[0]  # after the final norm
        emb = lm.embed_tokens(ids[0, 1:])
        c = torch.cat([norm("mtp.pre_fc_norm_embedding.weight")(emb),
                       norm("mtp.pre_fc_norm_hidden.weight")(hidden[:-1])], dim=-1)
        z = torch.nn.functional.linear(c, tensors["mtp.fc.weight"].float())[None]
        n = z.shape[1]
        pos = torch.arange(n)[None]
        pe = lm.rotary_emb(z, pos[None].expand(3, 1, n))
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        z = layer(z, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        if isinstance(z, tuple):
            z = z[0]
        return model.lm_head(norm("mtp.norm.weight")(z[0]))


def _rmsnorm(t, w):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm
    n = Qwen3_5MoeRMSNorm(w.shape[0], eps=t.rms_norm_eps)
    n.weight.data.copy_(w)
    return n


def references(model_dir, tok, min_margin):
    """Loads model_dir in float32 and computes logits, greedy ids and MTP logits."""
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    cfg = model.config
    ids = torch.tensor([tok.encode(PROMPT).ids])
    assert ids.shape[1] >= 40, ids.shape
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
        out = model(input_ids=ids, use_cache=True)
        cache, nxt, greedy, margins = out.past_key_values, out.logits[0, -1].argmax(), [], []
        margins.append(argmax_margin(out.logits[0, -1]))
        for _ in range(N_GREEDY):
            greedy.append(int(nxt))
            out = model(input_ids=nxt.view(1, 1), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            margins.append(argmax_margin(out.logits[0, -1]))
            nxt = out.logits[0, -1].argmax()
    tensors = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            tensors.update({k: v for k, v in load_file(os.path.join(model_dir, f)).items()
                            if k.startswith("mtp.")})
    tensors = tensors or None
    mtp = mtp_reference(model, tensors, ids, cfg).float() if tensors else None
    m = {"logits": argmax_margin(logits), "greedy": min(margins)}
    if mtp is not None:
        m["mtp"] = argmax_margin(mtp)
    ok = all(v >= min_margin for v in m.values())
    ref = {"prompt_ids": ids[0].to(torch.int32), "logits": logits.contiguous(),
           "greedy_ids": torch.tensor(greedy, dtype=torch.int32)}
    if mtp is not None:
        ref["mtp_logits"] = mtp.contiguous()
    return ref, m, ok


def write_common(out_dir, tok):
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(out_dir)), "tokenizer.json"), out_dir)
    gen = {"bos_token_id": tok.token_to_id("<|endoftext|>"),
           "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
           "pad_token_id": tok.token_to_id("<|endoftext|>"), "do_sample": True,
           "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)


def qforge(binary, *args):
    subprocess.run([binary, *args], check=True, stdout=subprocess.DEVNULL)


def build_hybrid(binary, src, dst, vocab):
    """The Spark recipe on a fixture: INT4 + FP8 shared experts + INT8 LM head."""
    with tempfile.TemporaryDirectory() as tmp:
        int4, fp8 = os.path.join(tmp, "int4"), os.path.join(tmp, "fp8")
        qforge(binary, "synth", int4, "--from", src, "--layout", "intel-int4", "--no-vision")
        qforge(binary, "synth", fp8, "--from", src, "--layout", "qwen-fp8", "--no-vision")
        qforge(binary, "build-hybrid", "--int4", int4, "--fp8", fp8, "--out", dst, "--no-check")
        if vocab % 4 == 0:
            qforge(binary, "quantize-lm-head", dst, "--in-place")
    for f in ("tokenizer.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--qforge", help="qforge binary: also build and reference the hybrid variants")
    ap.add_argument("--min-margin", type=float, default=2e-4)
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(a.out, exist_ok=True)
    tok = train_tokenizer(a.out)
    summary = {"transformers": transformers.__version__, "torch": torch.__version__,
               "tokenizers": tokenizers.__version__, "prompt": PROMPT, "models": {}}
    for name, shape in SHAPES.items():
        d = os.path.join(a.out, name, "model")
        for seed in range(100):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)  # OUT/<name>/model: the checkpoint; OUT/<name>/*.safetensors: references
            gen = torch.Generator().manual_seed(1000 * seed + len(name))
            cfg = make_config(shape, tok)
            model = Qwen3_5MoeForConditionalGeneration(cfg).float()
            randomize(model, cfg, gen)
            cfg.save_pretrained(d)
            save_release_layout(model, mtp_tensors(cfg, gen), d)
            write_common(d, tok)
            ref, margins, ok = references(d, tok, a.min_margin)
            if ok:
                break
            print(f"{name}: seed {seed} has a near-tie argmax {margins}, trying the next", file=sys.stderr)
        save_file(ref, os.path.join(a.out, name, "reference.safetensors"))
        entry = {"seed": seed, "margins": margins, "prompt_tokens": int(ref["prompt_ids"].numel())}
        if a.qforge:
            with tempfile.TemporaryDirectory() as tmp:
                h, deq = os.path.join(tmp, "hybrid"), os.path.join(tmp, "f32")
                build_hybrid(a.qforge, d, h, shape["vocab_size"])
                qforge(a.qforge, "dequantize", h, "--out", deq, "--dtype", "f32")
                href, hm, hok = references(deq, tok, 0.0)
            save_file(href, os.path.join(a.out, name, "hybrid_reference.safetensors"))
            entry["hybrid_margins"] = hm
        summary["models"][name] = entry
        print(f"{name}: seed {seed}, margins {entry}", file=sys.stderr)
    with open(os.path.join(a.out, "provenance.json"), "w") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
