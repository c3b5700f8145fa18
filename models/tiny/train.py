#!/usr/bin/env python3
"""qforge's embedded example model: a small Qwen3.5-MoE with an MTP head, trained on Python.

    pip install torch transformers==5.17.* safetensors tokenizers
    python3 models/tiny/train.py OUT [--minutes 5] [--deadline 8] [--steps N] [--smoke --batch 2]

The committed model came from `train.py OUT --minutes 5 --deadline 8` on an H200 (2133 steps;
`--steps 2133` runs as many steps without the clock; GPU training is not bit-reproducible).

Everything here runs on one GPU machine, offline, in one sitting:
  1. corpus: the Python sources and docs (*.py, *.rst, *.md under 256 KiB, UTF-8, deduplicated by
     content) of this Python's stdlib and site-packages, one document per file, sorted by path;
     a file whose content hash is 0 mod 50 is held out (about 2%);
  2. tokenizer: byte-level BPE, 4096 ids (4087 learned + 9 Qwen3.5 specials), trained with HF
     `tokenizers` using Qwen3.5's split regex and NFC (the same construction as the engine
     fixtures' tokenizer, tests/golden/make_model_goldens.py), on every 4th training document;
  3. model: Qwen3_5MoeForConditionalGeneration (transformers) with the text config below: hidden
     128, 8 layers (3 Gated DeltaNet : 1 gated attention), 8 routed experts top-2 + the shared
     expert, head_dim 256 with partial RoPE (6.7 M parameters, 13 MB in BF16: small enough for
     the repository and the 64 MiB the device machine takes), and an MTP head built to
     qwen35-architecture.md §5.2 from transformers' own decoder layer and norms, trained
     jointly to predict token t + 2:
         loss = CE(t+1) + 0.3 CE_mtp(t+2) + 0.001 load-balancing (every router, MTP's included);
     windows of 512 tokens sampled uniformly from the packed training stream (documents joined
     by <|endoftext|>), AdamW, cosine schedule, bf16 autocast over fp32 master weights;
  4. export: Qwen's BF16 release layout (fused routed experts, A_log and the gated norm F32, the
     MTP head with per-expert experts, no vision tower), then reloaded with from_pretrained in
     fp32 to measure, exactly as `qforge eval-ppl` does (non-overlapping windows of 512 tokens,
     each from a fresh state; the MTP head scored on t + 2 from the hidden state at t and token
     t + 1): held-out perplexity and top-1, the MTP head's top-1;
  5. references for qforge's tests: the same figures on heldout.txt (held-out stdlib files, the
     text committed beside the model) and its first 1024 tokens, and the SHA-256 of transformers'
     fine-grained FP8 quantization (block 128) of every linear weight, per expert as Qwen's FP8
     release names them.
OUT gets model/ (config.json, model.safetensors, tokenizer.json, generation_config.json),
heldout.txt, train_log.txt, provenance.json, fp8_reference.json.
"""
import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import torch
import tokenizers
import transformers
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as qm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_model_goldens import (SPECIALS, fused_experts, save_release_layout,  # noqa: E402
                                 train_tokenizer)

VOCAB = 4096
WINDOW = 512
EOT = "<|endoftext|>"
TEXT = dict(hidden_size=128, num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1,
            head_dim=256, linear_num_key_heads=2, linear_num_value_heads=8,
            linear_key_head_dim=64, linear_value_head_dim=32, linear_conv_kernel_dim=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, vocab_size=VOCAB, rms_norm_eps=1e-6,
            max_position_embeddings=4096, mtp_num_hidden_layers=1,
            mtp_use_dedicated_embeddings=False, router_aux_loss_coef=0.001,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                             "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                             "mrope_interleaved": True})
MTP_WEIGHT = 0.3
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n",
           "class Stack:\n    \"\"\"A last-in, first-out stack.\"\"\"\n\n    def __init__(self):\n",
           "# Read a JSON file and print its keys\n"]


def log(f, msg):
    print(msg, file=sys.stderr, flush=True)
    f.write(msg + "\n")
    f.flush()


# ---------------------------------------------------------------------------------------- corpus
def corpus(limit_files=None):
    """[(relative path, text, held_out)] sorted by path; relative to the roots below."""
    roots = sorted({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    seen, docs = set(), []
    for root in roots:
        for dirpath, dirnames, files in os.walk(root):
            dirnames.sort()
            for name in sorted(files):
                if not name.endswith((".py", ".rst", ".md")):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if os.path.getsize(path) > 256 * 1024:
                        continue
                    with open(path, "rb") as fh:
                        raw = fh.read()
                    text = raw.decode("utf-8").replace("\r\n", "\n")
                except (OSError, UnicodeDecodeError):
                    continue
                if len(text) < 64 or EOT in text or "<|im_" in text:
                    continue
                digest = hashlib.sha256(text.encode()).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                rel = ("stdlib/" if root == roots[0] else "site/") + os.path.relpath(path, root)
                docs.append((rel, text, int.from_bytes(digest[:8], "little") % 50 == 0))
    docs.sort(key=lambda d: d[0])
    return docs[::max(1, len(docs) // limit_files)] if limit_files else docs


def pack(tok, texts):
    """Documents joined by <|endoftext|>, as one int32 stream."""
    eot = tok.token_to_id(EOT)
    out = []
    for enc in tok.encode_batch(texts):
        out.extend(enc.ids)
        out.append(eot)
    return torch.tensor(out, dtype=torch.int32)


# ----------------------------------------------------------------------------------------- model
def make_config(tok):
    text = dict(TEXT, eos_token_id=tok.token_to_id("<|im_end|>"), dtype="bfloat16")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=text["hidden_size"])
    return Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)


class Mtp(torch.nn.Module):
    """qwen35-architecture.md §5.2: fc(concat(norm(embed(x_{t+1})), norm(h_t))) -> a full-attention
    MoE decoder layer at position t -> norm; the main model's embedding and LM head are shared."""

    def __init__(self, t):
        super().__init__()
        h = t.hidden_size
        full = next(i for i, k in enumerate(t.layer_types) if k == "full_attention")
        self.pre_fc_norm_embedding = qm.Qwen3_5MoeRMSNorm(h, eps=t.rms_norm_eps)
        self.pre_fc_norm_hidden = qm.Qwen3_5MoeRMSNorm(h, eps=t.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.layer = qm.Qwen3_5MoeDecoderLayer(t, full)
        self.norm = qm.Qwen3_5MoeRMSNorm(h, eps=t.rms_norm_eps)
        torch.nn.init.normal_(self.fc.weight, std=0.02)
        for name, p in self.layer.named_parameters():  # as transformers' _init_weights would
            if name.endswith("norm.weight"):
                torch.nn.init.zeros_(p)
            else:
                torch.nn.init.normal_(p, std=0.02)

    def forward(self, lm, hidden, next_ids):
        """hidden [B, n, H] after the final norm at positions 0..n-1, next_ids [B, n] the tokens
        at 1..n: the normed MTP output [B, n, H] for positions 2..n+1."""
        c = torch.cat([self.pre_fc_norm_embedding(lm.embed_tokens(next_ids)),
                       self.pre_fc_norm_hidden(hidden)], dim=-1)
        z = self.fc(c)
        b, n = next_ids.shape
        pos = torch.arange(n, device=z.device)[None].expand(b, n)
        pe = lm.rotary_emb(z, pos[None].expand(3, b, n))
        z = self.layer(z, position_embeddings=pe, attention_mask=None, position_ids=pos)
        return self.norm(z[0] if isinstance(z, tuple) else z)

    def release_tensors(self):
        """mtp.* names of Qwen's release, routed experts split per expert."""
        out = {"mtp.fc.weight": self.fc.weight,
               "mtp.pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding.weight,
               "mtp.pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden.weight,
               "mtp.norm.weight": self.norm.weight}
        for name, p in self.layer.state_dict().items():
            if name == "mlp.experts.gate_up_proj":
                inter = p.shape[1] // 2
                for x in range(p.shape[0]):
                    out[f"mtp.layers.0.mlp.experts.{x}.gate_proj.weight"] = p[x, :inter]
                    out[f"mtp.layers.0.mlp.experts.{x}.up_proj.weight"] = p[x, inter:]
            elif name == "mlp.experts.down_proj":
                for x in range(p.shape[0]):
                    out[f"mtp.layers.0.mlp.experts.{x}.down_proj.weight"] = p[x]
            else:
                out["mtp.layers.0." + name] = p
        return out


class RouterTap:
    """Collects every router's logits (forward hooks) for the load-balancing loss."""

    def __init__(self, modules):
        self.logits = []
        for m in modules:
            m.register_forward_hook(lambda _m, _i, out: self.logits.append(out[0]))

    def take(self):
        out, self.logits = tuple(self.logits), []
        return out


def losses(model, mtp, ids):
    """Mean CE of the main model (t+1) and of the MTP head (t+2) over windows ids [B, n]."""
    lm = model.model.language_model
    hidden = lm(input_ids=ids, use_cache=False).last_hidden_state
    logits = model.lm_head(hidden[:, :-1]).float()
    main = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten().long())
    mtp_logits = model.lm_head(mtp(lm, hidden[:, :-2], ids[:, 1:-1])).float()
    extra = torch.nn.functional.cross_entropy(mtp_logits.flatten(0, 1), ids[:, 2:].flatten().long())
    return main, extra


@torch.no_grad()
def evaluate(model, mtp, ids, device, batch=16):
    """`qforge eval-ppl`'s figures: windows of WINDOW tokens from a fresh state each."""
    lm = model.model.language_model
    ids = ids.tolist()
    windows = [ids[i:i + WINDOW] for i in range(0, len(ids), WINDOW)]
    windows = [w for w in windows if len(w) >= 2]
    acc = dict(nll=0.0, n=0, top1=0, mtp_nll=0.0, mtp_n=0, mtp_top1=0)
    groups = {}
    for w in windows:
        groups.setdefault(len(w), []).append(w)
    for n, ws in groups.items():
        for i in range(0, len(ws), batch):
            x = torch.tensor(ws[i:i + batch], device=device)
            hidden = lm(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[:, :-1]).double()
            tgt = x[:, 1:]
            acc["nll"] += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), tgt.flatten(), reduction="sum").item()
            acc["top1"] += (logits.argmax(-1) == tgt).sum().item()
            acc["n"] += tgt.numel()
            if n >= 3 and mtp is not None:
                ml = model.lm_head(mtp(lm, hidden[:, :-2], x[:, 1:-1])).double()
                mt = x[:, 2:]
                acc["mtp_nll"] += torch.nn.functional.cross_entropy(
                    ml.flatten(0, 1), mt.flatten(), reduction="sum").item()
                acc["mtp_top1"] += (ml.argmax(-1) == mt).sum().item()
                acc["mtp_n"] += mt.numel()
    out = {"tokens": len(ids), "windows": len(windows), "predictions": acc["n"],
           "nll": acc["nll"] / acc["n"], "ppl": math.exp(acc["nll"] / acc["n"]),
           "top1": acc["top1"] / acc["n"]}
    if acc["mtp_n"]:
        out["mtp"] = {"predictions": acc["mtp_n"], "nll": acc["mtp_nll"] / acc["mtp_n"],
                      "ppl": math.exp(acc["mtp_nll"] / acc["mtp_n"]),
                      "top1": acc["mtp_top1"] / acc["mtp_n"]}
    return out


# ---------------------------------------------------------------------------------------- export
def save_release(model, mtp, cfg, tok, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tensors = save_release_layout(model, mtp.release_tensors(), out_dir)
    cfg.save_pretrained(out_dir)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    gen = {"bos_token_id": tok.token_to_id(EOT),
           "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id(EOT)],
           "pad_token_id": tok.token_to_id(EOT), "do_sample": True,
           "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    return tensors


def reload(out_dir, device):
    """The exported checkpoint back through transformers in fp32, MTP head included."""
    model = Qwen3_5MoeForConditionalGeneration.from_pretrained(out_dir, dtype=torch.float32)
    model.config.text_config._attn_implementation = "sdpa"  # the MTP layer relies on its is_causal
    model.to(device).eval()
    from safetensors.torch import load_file
    saved = load_file(os.path.join(out_dir, "model.safetensors"))
    mtp = Mtp(model.config.text_config)
    sd = {}
    p = "mtp.layers.0."
    e = model.config.text_config.num_experts
    for name, v in saved.items():
        if not name.startswith("mtp.") or ".experts." in name:
            continue
        sd[("layer." + name[len(p):]) if name.startswith(p) else name[len("mtp."):]] = v.float()
    sd["layer.mlp.experts.gate_up_proj"], sd["layer.mlp.experts.down_proj"] = fused_experts(
        saved, p, e)
    mtp.load_state_dict(sd, strict=True)
    return model, mtp.to(device).eval()


def fp8_reference(tensors):
    """SHA-256 of transformers' fine-grained FP8 (block 128) of every 2-D linear weight whose
    sides are multiples of 128, routed experts per expert as Qwen's FP8 release names them."""
    import types
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize
    op = Fp8Quantize(types.SimpleNamespace(quantization_config=FineGrainedFP8Config(
        weight_block_size=(128, 128))))
    flat = {}
    for name, w in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            inter = w.shape[1] // 2
            base = name[:-len("gate_up_proj")]
            for x in range(w.shape[0]):
                flat[f"{base}{x}.gate_proj.weight"] = w[x, :inter]
                flat[f"{base}{x}.up_proj.weight"] = w[x, inter:]
        elif name.endswith("mlp.experts.down_proj"):
            base = name[:-len("down_proj")]
            for x in range(w.shape[0]):
                flat[f"{base}{x}.down_proj.weight"] = w[x]
        elif name.endswith(".weight") and w.dim() == 2:
            flat[name] = w
    out = {}
    for name, w in sorted(flat.items()):
        if w.dtype != torch.bfloat16 or w.shape[0] % 128 or w.shape[1] % 128:
            continue
        res = op.convert({name: w.contiguous()})
        scale = [k for k in res if k != name][0]
        out[name] = hashlib.sha256(res[name].cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
        out[name + "_scale_inv"] = hashlib.sha256(
            res[scale].cpu().to(torch.float32).numpy().tobytes()).hexdigest()
    return out


@torch.no_grad()
def samples(model, tok, device, n=48):
    out = {}
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt).ids], device=device)
        gen = model.generate(input_ids=ids, max_new_tokens=n, do_sample=False)
        out[prompt] = tok.decode(gen[0, ids.shape[1]:].tolist(), skip_special_tokens=False)
    return out


# ------------------------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    ap.add_argument("--deadline", type=float, help="minutes the whole run must end within")
    ap.add_argument("--steps", type=int, help="exact step count (overrides --minutes)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a few files and steps (CPU check)")
    a = ap.parse_args()
    t_start = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    logf = open(os.path.join(a.out, "train_log.txt"), "w")
    log(logf, f"torch {torch.__version__} transformers {transformers.__version__} tokenizers "
              f"{tokenizers.__version__} python {sys.version.split()[0]} device "
              f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")

    docs = corpus(400 if a.smoke else None)
    train_docs = [d for d in docs if not d[2]]
    held = [d for d in docs if d[2]]
    log(logf, f"corpus: {len(docs)} files, {sum(len(d[1]) for d in docs) / 1e6:.1f} M chars; "
              f"held out {len(held)} files, {sum(len(d[1]) for d in held) / 1e6:.2f} M chars")
    tok = train_tokenizer(a.out, [d[1] for d in train_docs[::4]], VOCAB - len(SPECIALS))
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    train_ids = pack(tok, [d[1] for d in train_docs])
    held_ids = pack(tok, [d[1] for d in held])
    stdlib_held = [d for d in held if d[0].startswith("stdlib/")]
    committed, size = [], 0
    for d in stdlib_held:
        if size > (8_000 if a.smoke else 120_000):
            break
        committed.append(d)
        size += len(d[1])
    heldout_text = EOT.join(d[1] for d in committed) + EOT
    with open(os.path.join(a.out, "heldout.txt"), "w") as f:
        f.write(heldout_text)
    log(logf, f"tokenizer: {tok.get_vocab_size()} ids; train {train_ids.numel() / 1e6:.2f} M tokens "
              f"({sum(len(d[1]) for d in train_docs) / train_ids.numel():.2f} chars/token), held out "
              f"{held_ids.numel() / 1e6:.3f} M; heldout.txt {len(committed)} stdlib files, "
              f"{len(heldout_text)} chars ({time.time() - t_start:.0f} s)")

    cfg = make_config(tok)
    cfg.text_config._attn_implementation = "sdpa"
    model = Qwen3_5MoeForConditionalGeneration(cfg).float().to(device)
    mtp = Mtp(cfg.text_config).float().to(device)
    lm = model.model.language_model
    params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
    params += list(mtp.parameters())
    n_params = sum(p.numel() for p in params)
    log(logf, f"model: {n_params / 1e6:.2f} M parameters (MTP head included), "
              f"layers {cfg.text_config.layer_types}")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=device == "cuda")
    routers = [m for m in list(lm.modules()) + list(mtp.modules())
               if isinstance(m, qm.Qwen3_5MoeTopKRouter)]
    tap = RouterTap(routers)
    e, k = cfg.text_config.num_experts, cfg.text_config.num_experts_per_tok
    data = train_ids.to(device)
    gen = torch.Generator(device=device).manual_seed(a.seed)
    batch = a.batch
    warmup = 5 if a.smoke else 200
    total = a.steps or (4 if a.smoke else None)
    budget = a.minutes * 60
    if a.deadline:  # leave 150 s for export, evaluation and the references
        budget = min(budget, a.deadline * 60 - (time.time() - t_start) - 150)
    t0, t10, step, seen = time.time(), 0.0, 0, 0
    while total is None or step < total:
        if total is None and step == 10:
            t10 = time.time()
        if total is None and step == 60:  # the steps that fit the budget, timed past warm-up
            per_step = (time.time() - t10) / 50
            total = max(100, 60 + int((budget - (time.time() - t0)) / per_step))
            log(logf, f"{total} steps fit {budget / 60:.2f} minutes")
        horizon = total or 10 ** 9
        lr = a.lr * min(1.0, (step + 1) / warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / horizon))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, data.numel() - WINDOW, (batch,), device=device, generator=gen)
        ids = data[starts[:, None] + torch.arange(WINDOW, device=device)].long()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            tap.take()
            main_loss, mtp_loss = losses(model, mtp, ids)
            aux = qm.load_balancing_loss_func(tap.take(), e, k)
            loss = main_loss + MTP_WEIGHT * mtp_loss + cfg.text_config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += ids.numel()
        if step % 100 == 0 or step == total or step <= 3:
            log(logf, f"step {step}/{total} lr {lr:.2e} loss {main_loss.item():.4f} mtp "
                      f"{mtp_loss.item():.4f} aux {aux.item():.3f} gnorm {gnorm.item():.2f} "
                      f"tokens {seen / 1e6:.1f} M {seen / (time.time() - t0) / 1e3:.0f} k tok/s")
    log(logf, f"trained {step} steps, {seen / 1e6:.1f} M tokens "
              f"({seen / train_ids.numel():.2f} epochs) in {time.time() - t0:.0f} s")

    model_dir = os.path.join(a.out, "model")
    tensors = save_release(model, mtp, cfg, tok, model_dir)
    model, mtp = reload(model_dir, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prov = {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "seed": a.seed, "steps": step, "batch": batch, "window": WINDOW, "lr": a.lr,
            "tokens_seen": seen, "parameters": n_params, "text_config": TEXT,
            "corpus": {"files": len(docs), "held_out_files": len(held),
                       "train_tokens": train_ids.numel(), "held_out_tokens": held_ids.numel(),
                       "sha256_of_paths": hashlib.sha256(
                           "\n".join(d[0] for d in docs).encode()).hexdigest()},
            "heldout_txt_files": [d[0] for d in committed]}
    heldout_ids = torch.tensor(tok.encode(heldout_text).ids)
    prov["eval"] = {"held_out_all": evaluate(model, mtp, held_ids, device),
                    "heldout_txt": evaluate(model, mtp, heldout_ids, device),
                    "heldout_txt_first_1024": evaluate(model, mtp, heldout_ids[:1024], device)}
    for key, r in prov["eval"].items():
        log(logf, f"eval {key}: {r['tokens']} tokens, ppl {r['ppl']:.4f}, top-1 {r['top1']:.4f}, "
                  f"MTP top-1 {r['mtp']['top1']:.4f} (MTP ppl {r['mtp']['ppl']:.3f})")
    prov["samples"] = samples(model, tok, device)
    for prompt, text in prov["samples"].items():
        log(logf, f"--- greedy: {prompt!r}\n{prompt}{text}")
    with open(os.path.join(a.out, "fp8_reference.json"), "w") as f:
        json.dump(fp8_reference(tensors), f, indent=1, sort_keys=True)
    with open(os.path.join(a.out, "provenance.json"), "w") as f:
        json.dump(prov, f, indent=1)
    log(logf, f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
