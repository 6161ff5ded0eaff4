#!/usr/bin/env python3
"""Regenerate a reference fixture with Hugging Face transformers (run it where torch and
transformers are installed, on a GPU machine or the CPU).

For a checkpoint directory in any of the three storage formats (BF16, block FP8, NVFP4), the
weights are dequantized to BF16 exactly as the checkpoint stores them, loaded into transformers'
own model class (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM or Qwen3NextForCausalLM), and run over a
prompt. Written beside OUT (a path prefix):

  OUT.safetensors   logits F32 [T, V]            one forward over the prompt
                    hidden_states F32 [L+2, T, H] embedding, each decoder layer's output, final norm
                    step_logits F32 [S, V]        greedy decoding: row 0 after the prompt, row i after
                                                  feeding greedy token i-1
                    mtp_logits F32 [T-1, V]       the MTP drafter at p = 0..T-2 (token p+1, final-norm
                                                  hidden state at p, rotary position p), when present
  OUT.tok           the S greedy ids
  OUT.json          greedy ids, top-1 minus top-2 margins, versions

transformers has no MTP module: the drafter is built from transformers' own decoder-layer and
norm classes, wired as docs/models.md describes.

  --intermediates F  also save layer 0's intermediate tensors (module outputs) to F
  --compare REF      print the relative error of each output against an existing fixture file
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def load_tensors(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def dequantize(t):
    """Every projection to BF16, as its checkpoint stores it: value = code x scale (x scale_2)."""
    out = {}
    for name, w in t.items():
        if name.endswith((".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if w.dtype == torch.float8_e4m3fn and base and base + ".weight_scale_inv" in t:
            s = t[base + ".weight_scale_inv"].float()
            n, k = w.shape
            s = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            out[name] = (w.float() * s).to(torch.bfloat16)
        elif w.dtype == torch.uint8 and base and base + ".weight_scale" in t:
            lut = torch.tensor(E2M1 + [-x for x in E2M1])
            lo, hi = lut[(w & 15).long()], lut[(w >> 4).long()]
            vals = torch.stack([lo, hi], dim=-1).reshape(w.shape[0], -1)
            sc = t[base + ".weight_scale"].float().repeat_interleave(16, 1)
            s2 = t[base + ".weight_scale_2"].float()
            out[name] = (vals * sc * s2).to(torch.bfloat16)
        else:
            out[name] = w
    return out


def build_model(cfg, tensors, device):
    import transformers

    arch = cfg["model_type"]
    if arch in ("qwen3_5", "qwen3_5_moe"):
        text = dict(cfg["text_config"])
        prefix = "model.language_model."
        if arch == "qwen3_5":
            conf = transformers.Qwen3_5TextConfig(**text)
            cls = transformers.Qwen3_5ForCausalLM
        else:
            conf = transformers.Qwen3_5MoeTextConfig(**text)
            cls = transformers.Qwen3_5MoeForCausalLM
    elif arch == "qwen3_next":
        conf = transformers.Qwen3NextConfig(**{k: v for k, v in cfg.items() if k != "quantization_config"})
        cls = transformers.Qwen3NextForCausalLM
        prefix = "model."
    else:
        sys.exit(f"make-fixture: model_type {arch} is not supported")
    conf._attn_implementation = "sdpa"
    # Parameters in BF16, as from_pretrained(dtype=bfloat16) gives them (F32-stored A_log and
    # gated-norm weights included: their values are exact in BF16); buffers such as the rotary
    # inverse frequencies are computed in FP32 by the model's own constructor.
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = cls(conf)
    finally:
        torch.set_default_dtype(torch.float32)
    sd = {}
    experts = {}
    for name, w in tensors.items():
        if name.startswith("mtp.") or name.startswith("model.visual."):
            continue
        key = "model." + name[len(prefix):] if name.startswith(prefix) else name
        if ".mlp.experts." in key and not key.endswith(("gate_up_proj", "down_proj")):
            # per-expert hub tensors -> transformers' fused experts
            head, rest = key.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(head, {}).setdefault(int(e), {})[proj] = w
            continue
        sd[key] = w.to(torch.bfloat16) if w.is_floating_point() else w
    for head, ex in experts.items():
        E = len(ex)
        sd[head + ".mlp.experts.gate_up_proj"] = torch.stack([torch.cat([ex[e]["gate_proj"], ex[e]["up_proj"]], 0) for e in range(E)])
        sd[head + ".mlp.experts.down_proj"] = torch.stack([ex[e]["down_proj"] for e in range(E)])
    if conf.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (conf.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"make-fixture: state dict mismatch: missing {missing[:5]} unexpected {unexpected[:5]}")
    if conf.tie_word_embeddings:
        model.tie_weights()
    model = model.to(device)
    return model.eval(), conf


def mtp_logits(model, conf, cfg, tensors, ids, hfin, device):
    """The MTP drafter over positions 0..T-2, from transformers' own layer classes."""
    import transformers

    arch = cfg["model_type"]
    names = {k[len("mtp."):]: v for k, v in tensors.items() if k.startswith("mtp.")}
    if not names:
        return None
    attn_idx = next(i for i, t in enumerate(conf.layer_types) if t == "full_attention")
    if arch == "qwen3_next":
        Layer, Norm = transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextDecoderLayer, \
            transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextRMSNorm
        import copy
        c2 = copy.deepcopy(conf)
        c2.mlp_only_layers = []
        layer = Layer(c2, attn_idx)
    elif arch == "qwen3_5":
        m = transformers.models.qwen3_5.modeling_qwen3_5
        Layer, Norm = m.Qwen3_5DecoderLayer, m.Qwen3_5RMSNorm
        layer = Layer(conf, attn_idx)
    else:
        m = transformers.models.qwen3_5_moe.modeling_qwen3_5_moe
        Layer, Norm = m.Qwen3_5MoeDecoderLayer, m.Qwen3_5MoeRMSNorm
        layer = Layer(conf, attn_idx)
    H = conf.hidden_size
    sd = {}
    experts = {}
    for k, v in names.items():
        if not k.startswith("layers.0."):
            continue
        key = k[len("layers.0."):]
        if ".experts." in key and not key.endswith(("gate_up_proj", "down_proj")):
            _, rest = key.split("mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(int(e), {})[proj] = v
            continue
        sd[key] = v
    if experts:
        E = len(experts)
        sd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]], 0) for e in range(E)])
        sd["mlp.experts.down_proj"] = torch.stack([experts[e]["down_proj"] for e in range(E)])
    layer.load_state_dict(sd, strict=True)
    layer = layer.to(device=device, dtype=torch.bfloat16).eval()
    pre_e, pre_h, norm = (Norm(H, eps=conf.rms_norm_eps) for _ in range(3))
    pre_e.weight.data = names["pre_fc_norm_embedding.weight"].clone()
    pre_h.weight.data = names["pre_fc_norm_hidden.weight"].clone()
    norm.weight.data = names["norm.weight"].clone()
    fc = torch.nn.Linear(2 * H, H, bias=False)
    fc.weight.data = names["fc.weight"].clone()
    for mod in (pre_e, pre_h, norm, fc):
        mod.to(device=device, dtype=torch.bfloat16)
    T = ids.shape[1]
    emb = model.model.embed_tokens(ids[:, 1:])
    x = fc(torch.cat([pre_e(emb), pre_h(hfin[:, : T - 1])], dim=-1))
    pos = torch.arange(T - 1, device=device)[None]
    # qwen3_5's rotary takes (3, batch, T) position ids (mrope; text positions are the same in all three)
    pe = model.model.rotary_emb(x, pos[None].expand(3, -1, -1) if arch != "qwen3_next" else pos)
    out = layer(x, position_embeddings=pe, attention_mask=None, position_ids=pos)
    out = out[0] if isinstance(out, tuple) else out
    return model.lm_head(norm(out))[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("prompt")
    ap.add_argument("out", help="output path prefix")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--intermediates")
    ap.add_argument("--compare")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in FP32 matrix products (default: off)")
    ap.add_argument("--from-pretrained", action="store_true",
                    help="load a BF16 checkpoint through transformers' from_pretrained instead of our loader")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    import transformers

    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    raw = load_tensors(a.model_dir)
    tensors = dequantize(raw)
    model, conf = build_model(cfg, tensors, a.device)
    if a.from_pretrained:
        cls = type(model)
        model = cls.from_pretrained(a.model_dir, dtype=torch.bfloat16).to(a.device).eval()
        conf = model.config
        print("# loaded through from_pretrained:", cls.__name__,
              {n: str(p.dtype) for n, p in model.named_parameters() if p.dtype != torch.bfloat16})
    ids = [int(x) for line in open(a.prompt) for x in line.split("#")[0].split()]
    ids_t = torch.tensor([ids], device=a.device)
    T, L = len(ids), conf.num_hidden_layers

    captured, hooks = {}, []
    def keep(name):
        def hook(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            captured[name] = o.detach()[0].float().cpu()
            if name.startswith("l0.") and inp and torch.is_tensor(inp[0]):
                captured[name + ".in"] = inp[0].detach()[0].float().cpu()
        return hook
    layers = model.model.layers
    for i, l in enumerate(layers):
        hooks.append(l.register_forward_hook(keep(f"layer{i}")))
    hooks.append(model.model.norm.register_forward_hook(keep("final_norm")))
    hooks.append(model.model.embed_tokens.register_forward_hook(keep("embed")))
    if a.intermediates:
        for n, mod in layers[0].named_modules():
            if n:
                hooks.append(mod.register_forward_hook(keep("l0." + n)))
    with torch.no_grad():
        # The prompt goes through the cache, as generate() sends it; decoding continues from it.
        cache = transformers.DynamicCache(config=conf)
        o = model(ids_t, past_key_values=cache, use_cache=True)
        logits = o.logits[0].float().cpu()
        hidden = torch.stack([captured["embed"]] + [captured[f"layer{i}"] for i in range(L)] + [captured["final_norm"]])
        hfin = captured["final_norm"].to(a.device, torch.bfloat16)[None]
        inter = {k: v.contiguous() for k, v in captured.items() if k.startswith("l0.")}
        for h in hooks:
            h.remove()
        # greedy decoding, logits at every step
        steps, greedy = [], []
        nxt = o.logits[0, -1]
        for s in range(a.steps):
            steps.append(nxt.float().cpu())
            tok = int(torch.argmax(nxt))
            greedy.append(tok)
            if s + 1 == a.steps:
                break
            o = model(torch.tensor([[tok]], device=a.device), past_key_values=o.past_key_values, use_cache=True)
            nxt = o.logits[0, -1]
        mtp = mtp_logits(model, conf, cfg, tensors, ids_t, hfin, a.device)
    res = {"logits": logits.contiguous(), "hidden_states": hidden.contiguous(), "step_logits": torch.stack(steps).contiguous()}
    if mtp is not None:
        res["mtp_logits"] = mtp.cpu().contiguous()
    save_file(res, a.out + ".safetensors")
    with open(a.out + ".tok", "w") as f:
        f.write("".join(f"{t}\n" for t in greedy))
    margins = [float(torch.topk(s, 2).values[0] - torch.topk(s, 2).values[1]) for s in steps]
    json.dump({"greedy": greedy, "greedy_margins": margins, "prompt_len": T, "transformers": transformers.__version__,
               "torch": torch.__version__, "device": a.device, "tf32": a.tf32}, open(a.out + ".json", "w"), indent=1)
    if a.intermediates:
        save_file(inter, a.intermediates)
    if a.compare:
        with safe_open(a.compare, framework="pt") as f:
            for k in res:
                if k in f.keys():
                    r = f.get_tensor(k).float()
                    g = res[k].float()
                    err = float((g - r).norm() / r.norm())
                    same = float((g == r).float().mean())
                    print(f"# compare {k}: relative error {err:.3e}, identical elements {same:.4f}")
                    if k == "hidden_states":
                        for i in range(g.shape[0]):
                            print(f"#   hidden {i}: rel {float((g[i]-r[i]).norm()/r[i].norm()):.3e} identical {float((g[i]==r[i]).float().mean()):.4f}")
    print(f"# make-fixture: {a.out}.safetensors, greedy {greedy[:8]}...")


if __name__ == "__main__":
    main()
