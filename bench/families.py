"""The families table: which Hugging Face architectures diagnose handles, under eager and sdpa,
for capture, ablation and checks. Tiny randomly initialised models built from configs (nothing
is downloaded), so anyone can run it: `make families` (a few minutes on 2 cores).

capture   the captured maps equal the eager model's own output_attentions (for sdpa: the same
          weights run eager), one map per attention site, max |difference| <= 1e-5
ablation  the head gate at 1 leaves the output unchanged, and closing head 0 of the first and the
          last site equals zeroing that head's slice of the output-projection weights
          (shared layers: closing changes the output; weights are shared, so no weight twin)
checks    check_model finds no problem on the correct model (count of checks skipped, with why,
          in --verbose)

    OMP_NUM_THREADS=1 .venv/bin/python bench/families.py [--only gpt2,bert] [--verbose] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

import diagnose  # noqa: E402
from diagnose.objectives import call_model  # noqa: E402
from diagnose.zoo.families import FAMILIES, SMALL, build  # noqa: E402

T, V = 8, SMALL["vocab_size"]  # the architectures: diagnose/zoo/families.py, the one table tests read too


def inputs_for(name: str, model) -> dict:
    kind = FAMILIES[name].kind
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (2, T), generator=g)  # [B, T]
    mask = torch.ones(2, T, dtype=torch.long)
    if kind == "image":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    if kind == "audio":
        cfg = model.config
        return {"input_features": torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g),
                "decoder_input_ids": ids[:, :6]}
    if kind == "seq2seq":
        return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": ids[:, :6]}
    return {"input_ids": ids, "attention_mask": mask}


def own_maps(model, inputs) -> list[torch.Tensor]:
    """The eager model's own attention maps, in forward order (encoder, then per decoder layer self, cross)."""
    with torch.no_grad():
        out = call_model(model, {**inputs, "output_attentions": True})
    if getattr(out, "encoder_attentions", None) is not None:
        dec = [m for pair in zip(out.decoder_attentions, out.cross_attentions) for m in pair]
        return list(out.encoder_attentions) + dec
    return list(out.attentions)


def output(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        out = call_model(model, inputs)
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state).float()


def check_capture(name: str, impl: str) -> str:
    eager = build(name, "eager")
    model = eager if impl == "eager" else build(name, impl, state=eager.state_dict())
    inputs = inputs_for(name, model)
    want = own_maps(eager, inputs)
    got = diagnose.capture(model, inputs, activations=False).attention
    if len(got) != len(want):
        return f"{len(got)} maps, model has {len(want)}"
    err = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
    return "ok" if err <= 1e-5 else f"max diff {err:.1e}"


def _zeroed(name: str, proj, h: int, D: int):
    w = proj.weight
    if FAMILIES[name].weight_in_out:  # GPT-2's Conv1D stores [in, out]
        return w, (slice(h * D, (h + 1) * D), slice(None))
    return w, (slice(None), slice(h * D, (h + 1) * D))


def check_ablation(name: str, impl: str) -> str:
    model = build(name, impl)
    inputs = inputs_for(name, model)
    sites = diagnose.find_heads(model, example=inputs)
    base = output(model, inputs)
    for site in {id(s): s for s in (sites[0], sites[-1])}.values():
        with site.adapter.intervene(site, lambda x: x):
            if (output(model, inputs) - base).abs().max() > 1e-6:
                return f"gate at 1 changed {site.name}"

        def close(x):  # [B, T, H, D]
            x = x.clone()
            x[:, :, 0] = 0
            return x
        with site.adapter.intervene(site, close):
            gated = output(model, inputs)
        if (gated - base).abs().max() <= 1e-6:
            return f"closing a head of {site.name} changed nothing"
        if site.application is not None:
            continue  # one set of weights at every depth: no weight twin for one depth
        w, idx = _zeroed(name, site.out_proj, 0, site.head_dim)
        saved = w.detach().clone()
        with torch.no_grad():
            w[idx] = 0
            expected = output(model, inputs)
            w.copy_(saved)
        if (gated - expected).abs().max() > 1e-5:
            return f"gate != weight zeroing at {site.name}"
    shared = any(s.application is not None for s in sites)
    return f"ok ({len(sites)} sites{', shared' if shared else ''})"


def check_checks(name: str, impl: str, verbose: bool) -> str:
    result = diagnose.check_model(build(name, impl))
    if result.problems:
        return "found: " + ", ".join(f"{f.check} {f.severity}" for f in result.problems)
    why = "; ".join(f"{s['check']}: {s['why']}" for s in result.skipped) if verbose else ""
    return f"ok ({len(result.passed)} passed, {len(result.skipped)} skipped{': ' + why if why else ''})"


# what a finding on a correct library model means, printed under the table
NOTES = {
    "GPT-Neo": "GPT-Neo does not divide its attention scores by sqrt(d_k), by design: the scaling check measures it.",
    "Bloom": "scaling skipped: ALiBi adds a per-position bias, so scores are no multiple of q.k.",
    "DeBERTa-v2": "scaling skipped: its disentangled relative-position terms make scores no multiple of q.k.",
    "T5": "T5 folds 1/sqrt(d_k) into its weight initialisation, so its scores read as unscaled (documented).",
}


def cell(fn, *args) -> str:
    try:
        return fn(*args)
    except Exception as exc:  # a family the tool does not handle: say how it failed
        if "does not support an attention implementation" in str(exc):
            return "n/a (no sdpa in transformers)"
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    names = [n for n in FAMILIES if not args.only or n in args.only.split(",")]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, diagnose {diagnose.__version__}")
    print("\n| architecture | attention | capture | ablation | checks |\n| --- | --- | --- | --- | --- |")
    start = time.perf_counter()
    for name in names:
        for impl in ("eager", "sdpa"):
            row = [cell(check_capture, name, impl), cell(check_ablation, name, impl),
                   cell(check_checks, name, impl, args.verbose)]
            print(f"| {name} | {impl} | " + " | ".join(r.replace("|", "/") for r in row) + " |", flush=True)
    print(f"\n{len(names)} architectures x 2 in {time.perf_counter() - start:.0f} s")
    for name in names:
        if name in NOTES:
            print(f"- {name}: {NOTES[name]}")


if __name__ == "__main__":
    main()
