"""torch.compile: a compiled run records the eager run's names, statistics and attention samples,
within a bounded number of graphs and without graph breaks.

Kept cheap (the suite runs several times per CI pass on 2 cores): a 2-layer d_model 16 model (1
layer in the Hugging Face cases but one per family: each block costs seconds of tracing), 5
steps with attention on steps 0, 2 and 4 (the samples after the first are those a traced graph
used to lose), one eager run shared by the module. What the monitor controls (its hooks inside
the graph, the guards that pick a graph, graph counts and breaks) is dynamo's, so most runs use
the `aot_eager` backend: dynamo and AOTAutograd as under inductor, without generating and building
C++ kernels (about a minute on a 2-core machine with a cold cache, more when it is loaded). One
run, of 1 layer and 3 steps, uses inductor itself, whose fused kernels reorder the statistics' sums.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import ExitStack
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from diagnose.monitor import TrainingMonitor
from diagnose.adapters.base import TRACED_HOOKS
from diagnose.monitor._head_importance import HEAD_ROWS, ICL_ROWS
from diagnose.monitor._signals import is_compiled, unwrap
from diagnose.zoo import ModelConfig, Transformer
from ..tolerance import approx

pytestmark = pytest.mark.numerics

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=16, max_len=8, vocab_size=32)
STEPS, ATTENTION_EVERY = 5, 2  # attention on steps 0, 2, 4
BACKEND = "aot_eager"
# inductor writes at::vec C++ kernels for the CPU it detects; under ATEN_CPU_CAPABILITY=default the
# headers it compiles against have no at::vec, so g++ fails: torch's limitation, not diagnose's
# the adapters' traced hooks (HF families, the intercept as `with mode:`) need torch >= 2.13 (adapters/base.py)
needs_traced_hooks = pytest.mark.skipif(not TRACED_HOOKS, reason="diagnose's traced attention hooks need torch >= 2.13")
needs_inductor = pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") == "default",
                                    reason="inductor's CPU kernels do not build under ATEN_CPU_CAPABILITY=default")


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(run_dir, how: str, backend: str = BACKEND, cfg: ModelConfig = CFG, steps: int = STEPS) -> list[dict]:
    """`steps` steps of SGD on fixed random tokens; how: eager, compiled (the monitor is given
    torch.compile(model)) or before (the monitor attached first, the model compiled after)."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if how == "compiled":
        net = torch.compile(model, backend=backend)
        monitor = TrainingMonitor(net, run_dir, attention_every=ATTENTION_EVERY, every=1, echo=False)
    else:
        monitor = TrainingMonitor(model, run_dir, attention_every=ATTENTION_EVERY, every=1, echo=False)
        net = torch.compile(model, backend=backend) if how == "before" else model
    gen = torch.Generator().manual_seed(1)
    with monitor:
        for _ in range(steps):
            ids = torch.randint(0, cfg.vocab_size, (4, cfg.max_len), generator=gen)  # [B, T]
            loss = F.cross_entropy(net(ids).reshape(-1, cfg.vocab_size), ids.reshape(-1))
            loss.backward()
            monitor.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules()), "hooks left"
    return _records(run_dir)


def _counted(run):
    """run() from a fresh dynamo; (its result, graphs, graph breaks) as dynamo counted them."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # nothing lost, so nothing to warn about
            if not TRACED_HOOKS:  # but the max logit, which torch < 2.13 cannot hand over in the graph: said once
                warnings.filterwarnings("ignore", "diagnose: the max pre-softmax logit is not sampled", RuntimeWarning)
            out = run()
        return out, counters["stats"]["unique_graphs"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()


def _eager_only(key: str) -> bool:
    """A number only an eager run records: the heads' importance and role shares and the in-context
    loss are not sampled under torch.compile (_head_importance.py; `diagnose stats` says why)."""
    name = key.split("[")[0].rsplit(".", 1)[-1]
    return (key.startswith("attention.") and name in HEAD_ROWS) or key in ICL_ROWS


def _numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """Every finite number of a record, by its path (step_time, time and tokens/s left out)."""
    out: dict[str, float] = {}
    for k, v in record.items():
        if k in ("time", "step_time", "tokens_per_s"):
            continue
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out.update({f"{prefix}{k}[{i}]": x for i, x in enumerate(v) if isinstance(x, float)})
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            out[f"{prefix}{k}"] = float(v)
    return out


def _assert_same_run(got: list[dict], eager: list[dict], graphs: int, breaks: dict, blocks: list[str],
                     cfg: ModelConfig = CFG) -> None:
    """Eager's names, attention sample steps and statistics, in at most 2 graphs with no break."""
    assert 1 <= graphs <= 2, f"{graphs} graphs: the hooks must not cost a recompile per sample"
    assert not breaks, breaks
    steps = list(range(len(eager)))
    assert [r["step"] for r in got] == [r["step"] for r in eager] == steps and len(steps) > ATTENTION_EVERY
    assert list(got[0]["layers"]) == list(eager[0]["layers"]) == blocks
    assert [r["step"] for r in got if "attention" in r] == [r["step"] for r in eager if "attention" in r] == \
        steps[::ATTENTION_EVERY]
    for a, b in zip(got, eager, strict=True):
        na, nb = _numbers(a), _numbers(b)
        if not TRACED_HOOKS:  # torch < 2.13: the max logit is not handed over in the graph (its probe warns)
            nb = {k: v for k, v in nb.items() if ".max_logit" not in k}
        assert not [k for k in na if _eager_only(k)]  # not sampled under compile: no hook of theirs ran
        nb = {k: v for k, v in nb.items() if not _eager_only(k)}
        assert na.keys() == nb.keys()
        for key in nb:  # compiled kernels may fuse and reorder reductions: float noise, not exact
            assert na[key] == approx(nb[key], scale=max(1.0, abs(nb[key])), depth=cfg.n_layers * (b["step"] + 1),
                                     width=cfg.d_model), key


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> list[dict]:
    return _train(tmp_path_factory.mktemp("eager"), "eager")


def test_unwrap_looks_through_compile_and_ddp_wrappers():
    model = Transformer(CFG)
    compiled = torch.compile(model)
    assert unwrap(compiled) is model and is_compiled(compiled)
    assert unwrap(torch.nn.DataParallel(compiled)) is model and is_compiled(torch.nn.DataParallel(compiled))
    assert unwrap(model) is model and not is_compiled(model)


@pytest.mark.parametrize("how", ["compiled", "before"])
def test_compiled_run_equals_eager(tmp_path, eager, how):
    got, graphs, breaks = _counted(lambda: _train(tmp_path, how))
    _assert_same_run(got, eager, graphs, breaks, ["blocks.0", "blocks.1"])
    assert all("z_sq_mean" in r for r in got)  # the output-logit hook runs, eagerly, beside the graph


def _without_graph_caches() -> ExitStack:
    """inductor's FX graph cache and AOTAutograd's cache, off for this run. torch keys them without
    the CPU kernel path: a graph compiled under one ATEN_CPU_CAPABILITY (CI runs several on one
    machine, one cache folder) was served under another, where it crashed in malloc or gave NaN
    (torch 2.13, seen with avx512 then avx2). The C++ build cache, keyed by the kernels' source,
    stays on, so a second run does not pay g++ again."""
    stack = ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    functorch_config = torch._functorch.config
    if hasattr(functorch_config, "enable_autograd_cache"):  # torch >= 2.5
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


@pytest.mark.slow
@needs_inductor
def test_inductor_run_equals_eager(tmp_path):
    """One layer and 3 steps (attention on 0 and 2): inductor builds a C++ kernel file per graph."""
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, max_len=8, vocab_size=32)
    eager = _train(tmp_path / "eager", "eager", cfg=cfg, steps=3)
    with _without_graph_caches():
        got, graphs, breaks = _counted(lambda: _train(tmp_path / "compiled", "compiled", "inductor", cfg, steps=3))
    _assert_same_run(got, eager, graphs, breaks, ["blocks.0"], cfg)


def test_graph_traced_without_the_hooks_warns_once(tmp_path):
    torch.manual_seed(0)
    model = Transformer(CFG)
    net = torch.compile(model, backend=BACKEND)
    torch._dynamo.reset()
    ids = torch.randint(0, CFG.vocab_size, (2, CFG.max_len), generator=torch.Generator().manual_seed(1))
    try:
        net(ids).sum().backward()  # traced before the monitor: its hooks are not in the graph
        with TrainingMonitor(net, tmp_path / "run", attention_every=1, every=1, echo=False) as monitor:
            with pytest.warns(RuntimeWarning, match=r"torch\._dynamo\.reset\(\)") as caught:
                for _ in range(2):
                    net(ids).sum().backward()
                    monitor.step(1.0)
            torch._dynamo.reset()  # the fix the warning names: traced again, with the hooks
            net(ids).sum().backward()
            record = monitor.step(1.0)
    finally:
        torch._dynamo.reset()
    lost = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(lost) == 1 and "Lost:" in lost[0], lost
    assert "act_mean" in record["layers"]["blocks.0"] and "attention" in record


def _lightning_run(run_dir, compiled: bool, make_net=lambda: Transformer(CFG),
                   logits_of=lambda net, ids: net(ids)) -> list[dict]:
    """STEPS Lightning steps of next-token loss with the diagnose callback; Lightning compiles
    training_step with the backend given when `compiled`."""
    L = pytest.importorskip("lightning.pytorch")
    from diagnose.monitor.lightning import DiagnoseCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_net()

        def training_step(self, batch, _):
            (ids,) = batch
            logits = logits_of(self.net, ids)  # [B, T, V]
            return F.cross_entropy(logits[:, :-1].reshape(-1, CFG.vocab_size), ids[:, 1:].reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    module = Module()
    ids = torch.randint(0, CFG.vocab_size, (4 * STEPS, CFG.max_len), generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    trainer = L.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", default_root_dir=str(run_dir),
                        callbacks=[DiagnoseCallback(run_dir / "diag", every=1, echo=False, attention_every=ATTENTION_EVERY)])
    trainer.fit(torch.compile(module, backend=BACKEND) if compiled else module, loader)
    return _records(run_dir / "diag")


@pytest.mark.slow
def test_lightning_callback_with_compile_equals_eager(tmp_path):
    eager = _lightning_run(tmp_path / "eager", False)
    got, graphs, breaks = _counted(lambda: _lightning_run(tmp_path / "compiled", True))
    _assert_same_run(got, eager, graphs, breaks, ["net.blocks.0", "net.blocks.1"])


def _gpt2(attn: str, layers: int = CFG.n_layers):
    """A tiny Hugging Face GPT-2 (dropout off: compiled and eager draw different masks)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=layers, n_head=CFG.n_heads, n_embd=CFG.d_model,
                                     n_positions=CFG.max_len, vocab_size=CFG.vocab_size, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                     attn_implementation=attn)
    return transformers.GPT2LMHeadModel(config)


def _llama(attn: str, layers: int = CFG.n_layers):
    """A tiny Hugging Face LLaMA with grouped-query attention (4 query heads read 2 key/value heads)
    and rotary positions."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=CFG.d_model, intermediate_size=2 * CFG.d_model,
                                      max_position_embeddings=CFG.max_len, vocab_size=CFG.vocab_size,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation=attn)
    return transformers.LlamaForCausalLM(config)


def _bert(attn: str, layers: int = CFG.n_layers):
    """A tiny Hugging Face BERT masked-LM (post-norm encoder, no causal mask), dropout off."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=layers, num_attention_heads=CFG.n_heads,
                                     hidden_size=CFG.d_model, intermediate_size=2 * CFG.d_model,
                                     max_position_embeddings=CFG.max_len, vocab_size=CFG.vocab_size,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     attn_implementation=attn)
    return transformers.BertForMaskedLM(config)


def _gemma2(attn: str, layers: int = CFG.n_layers):
    """A tiny Hugging Face Gemma 2: its attention logits are soft-capped (tanh) before the softmax,
    which the rebuilding hooks do not do, so under compile the intercept runs in its traced form."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=4, hidden_size=CFG.d_model, intermediate_size=2 * CFG.d_model,
                                       max_position_embeddings=CFG.max_len, vocab_size=CFG.vocab_size,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation=attn)
    return transformers.Gemma2ForCausalLM(config)


class _HandAttention(torch.nn.Module):
    """nanoGPT's attention as people write it: one qkv Linear, explicit softmax or SDPA."""

    def __init__(self, sdpa: bool):
        super().__init__()
        self.n_head, self.sdpa = CFG.n_heads, sdpa
        self.c_attn, self.c_proj = torch.nn.Linear(CFG.d_model, 3 * CFG.d_model), torch.nn.Linear(CFG.d_model, CFG.d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        else:
            att = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)  # [B, H, T, T]
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class _HandBlock(torch.nn.Module):
    def __init__(self, sdpa: bool):
        super().__init__()
        d = CFG.d_model
        self.ln_1, self.attn = torch.nn.LayerNorm(d), _HandAttention(sdpa)
        self.ln_2, self.mlp = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _HandDecoder(torch.nn.Module):
    """A hand-written pre-LN decoder: no adapter of its own, found by the generic adapter."""

    def __init__(self, sdpa: bool, layers: int = CFG.n_layers):
        super().__init__()
        d = CFG.d_model
        self.wte, self.wpe = torch.nn.Embedding(CFG.vocab_size, d), torch.nn.Embedding(CFG.max_len, d)
        self.h = torch.nn.ModuleList(_HandBlock(sdpa) for _ in range(layers))
        self.lm_head = torch.nn.Linear(d, CFG.vocab_size)

    def forward(self, input_ids):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))  # [B, T, d]
        for block in self.h:
            x = block(x)
        return _Out(self.lm_head(x))


class _Out:
    def __init__(self, logits):
        self.logits = logits


def _train_gpt2(run_dir, how: str, attn: str, checkpointed: bool = False, steps: int = STEPS,
                make=_gpt2, layers: int = CFG.n_layers) -> list[dict]:
    """As _train, for a tiny Hugging Face model (GPT-2 unless `make` says) of `layers` blocks, with
    gradient checkpointing (each block's forward run again in backward) when asked."""
    torch.manual_seed(0)
    model = make(attn, layers)
    if checkpointed:  # transformers 5 renamed it; its own hook on the embedding stays
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    own = [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model.modules()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    net = torch.compile(model, backend=BACKEND) if how == "compiled" else model
    monitor = TrainingMonitor(net, run_dir, attention_every=ATTENTION_EVERY, every=1, echo=False)
    net = torch.compile(model, backend=BACKEND) if how == "before" else net
    gen = torch.Generator().manual_seed(1)
    # a decoder's cache is off (under checkpointing transformers logs that it turns it off: a graph break)
    cache = {} if make in (_bert, _hand) else {"use_cache": False}
    with monitor:
        for _ in range(steps):
            ids = torch.randint(0, CFG.vocab_size, (4, CFG.max_len), generator=gen)  # [B, T]
            logits = net(input_ids=ids, **cache).logits  # [B, T, V]; HF's own loss logs (a graph break)
            loss = F.cross_entropy(logits.reshape(-1, CFG.vocab_size), ids.reshape(-1))
            loss.backward()
            monitor.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    assert [(dict(m._forward_hooks), dict(m._forward_pre_hooks)) for m in model.modules()] == own, "hooks left"
    assert not any("forward" in vars(m) for m in model.modules()), "a wrapped forward left"
    assert not getattr(torch._dynamo.config, "skip_fwd_side_effects_in_bwd_under_checkpoint", False), "config left"
    return _records(run_dir)


# each value of each parameter at least once; a fifth case, compiled x sdpa unchecked, was its parts'
# (compiled x sdpa checkpointed, before x sdpa unchecked) and proved nothing more. Each trace costs
# seconds per block (dynamo unrolls them), so one case per family has two blocks (each block's hooks
# its own, in one graph) and the others one: what they vary (the order of compile and monitor, the
# attention kernel, checkpointing) is the same in every block
@needs_traced_hooks
@pytest.mark.parametrize("how, attn, checkpointed, layers", [
    ("compiled", "eager", False, 1), ("before", "sdpa", False, 1), ("compiled", "sdpa", True, 2), ("before", "eager", True, 1)])
def test_compiled_hf_gpt2_run_equals_eager(tmp_path, how, attn, checkpointed, layers):
    """GPT-2's attention is watched by hooks dynamo traces (its adapter's watch_pattern_traced); the
    eager run is checkpointed (each block run again in backward) for three cases, which must not
    change a number, and so are two compiled runs (the hooks inside checkpoint's higher-order op)."""
    eager = _train_gpt2(tmp_path / "eager", "eager", attn, checkpointed=checkpointed or how == "before", layers=layers)
    assert [r["step"] for r in eager if "attention" in r] == list(range(STEPS))[::ATTENTION_EVERY]
    got, graphs, breaks = _counted(lambda: _train_gpt2(tmp_path / "compiled", how, attn, checkpointed, layers=layers))
    _assert_same_run(got, eager, graphs, breaks, [f"transformer.h.{i}" for i in range(layers)], replace(CFG, n_layers=layers))
    sampled = [r for r in got if "attention" in r]
    assert sampled and all("max_logit" in str(r["attention"]) for r in sampled)  # eager: from the softmax's input


@needs_traced_hooks
@pytest.mark.parametrize("how, attn, checkpointed, layers", [("compiled", "eager", False, 1), ("before", "sdpa", True, 2)])
def test_compiled_hf_llama_run_equals_eager(tmp_path, how, attn, checkpointed, layers):
    """LLaMA's attention is watched by hooks dynamo traces: q and k from q_proj and k_proj, rotated
    by the family's own apply_rotary_pos_emb, key heads repeated for grouped-query attention."""
    eager = _train_gpt2(tmp_path / "eager", "eager", attn, checkpointed=checkpointed, make=_llama, layers=layers)
    assert [r["step"] for r in eager if "attention" in r] == list(range(STEPS))[::ATTENTION_EVERY]
    got, graphs, breaks = _counted(lambda: _train_gpt2(tmp_path / "compiled", how, attn, checkpointed, make=_llama,
                                                        layers=layers))
    _assert_same_run(got, eager, graphs, breaks, [f"model.layers.{i}" for i in range(layers)], replace(CFG, n_layers=layers))
    assert all(len(r["attention"]["model.layers.0.self_attn"]["entropy"]) == 4 for r in got if "attention" in r)


def _hand(attn: str, layers: int = CFG.n_layers):
    return _HandDecoder(sdpa=attn == "sdpa", layers=layers)




@needs_traced_hooks
@pytest.mark.parametrize("how, attn, make, layers", [("compiled", "softmax", _hand, 2), ("compiled", "sdpa", _hand, 1),
                                                     ("before", "softmax", _hand, 1), ("compiled", "eager", _gemma2, 2)])
def test_compiled_intercepted_run_equals_eager(tmp_path, how, attn, make, layers):
    """Attention read through the intercept (a hand-written model's softmax or SDPA call; Gemma 2's
    soft-capped softmax, its two blocks of two kinds: sliding-window, then global) under compile: the
    mode runs as `with` around the attention's forward, which dynamo traces into the graph; the
    forward is put back on close."""
    eager = _train_gpt2(tmp_path / "eager", "eager", attn, make=make, layers=layers)
    assert [r["step"] for r in eager if "attention" in r] == list(range(STEPS))[::ATTENTION_EVERY]
    got, graphs, breaks = _counted(lambda: _train_gpt2(tmp_path / "compiled", how, attn, make=make, layers=layers))
    _assert_same_run(got, eager, graphs, breaks, list(eager[0]["layers"]), replace(CFG, n_layers=layers))
    assert len(eager[0]["layers"]) == layers


@needs_traced_hooks
@pytest.mark.parametrize("how, attn", [("compiled", "sdpa")])
def test_compiled_hf_bert_run_equals_eager(tmp_path, how, attn):
    """BERT's attention is watched by hooks dynamo traces: q and k from self.query and self.key (one
    case: the same kind of hooks as GPT-2's and LLaMA's, whose cases prove both orders of compile and
    monitor, the monitor then switching to the traced hooks, and both attention kernels)."""
    eager = _train_gpt2(tmp_path / "eager", "eager", attn, make=_bert)
    got, graphs, breaks = _counted(lambda: _train_gpt2(tmp_path / "compiled", how, attn, make=_bert))
    _assert_same_run(got, eager, graphs, breaks, ["bert.encoder.layer.0", "bert.encoder.layer.1"])


def _hf_trainer_run(run_dir, compiled: bool) -> list[dict]:
    """8 Trainer steps of a tiny GPT-2 with the HF callback (attention on steps 2, 4, 6, 8)."""
    transformers = pytest.importorskip("transformers")
    from diagnose.monitor.hf import DiagnoseHFCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=CFG.n_layers, n_head=CFG.n_heads, n_embd=CFG.d_model,
                                     n_positions=CFG.max_len, vocab_size=CFG.vocab_size, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # unset, transformers logs a warning in the forward: a graph break of its own
    ids = torch.randint(0, CFG.vocab_size, (32, CFG.max_len), generator=torch.Generator().manual_seed(1))  # [N, T]
    args = transformers.TrainingArguments(
        output_dir=str(run_dir / "out"), max_steps=8, per_device_train_batch_size=4, report_to=[], save_strategy="no",
        logging_strategy="no", max_grad_norm=0.0, use_cpu=True, disable_tqdm=True, seed=0,
        **({"torch_compile": True, "torch_compile_backend": BACKEND} if compiled else {}))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=[{"input_ids": x, "labels": x} for x in ids],
                                   callbacks=[DiagnoseHFCallback(run_dir / "diag", attention_every=2, every=1, echo=False)])
    trainer.train()
    return _records(run_dir / "diag")


@needs_traced_hooks
@pytest.mark.slow
def test_hf_callback_with_compile_equals_eager(tmp_path):
    eager = _hf_trainer_run(tmp_path / "eager", False)
    got, graphs, breaks = _counted(lambda: _hf_trainer_run(tmp_path / "compiled", True))
    assert 1 <= graphs <= 2 and not breaks, (graphs, breaks)
    assert [r["step"] for r in got] == [r["step"] for r in eager] == list(range(1, 9))  # the Trainer's steps
    sampled = [r["step"] for r in got if "attention" in r]
    assert sampled == [r["step"] for r in eager if "attention" in r] == [2, 4, 6, 8]
    assert list(got[0]["layers"]) == list(eager[0]["layers"]) == ["transformer.h.0", "transformer.h.1"]
    for a, b in zip(got, eager, strict=True):
        na, nb = _numbers(a), _numbers(b)
        assert not [k for k in na if _eager_only(k)]
        nb = {k: v for k, v in nb.items() if not _eager_only(k)}
        assert na.keys() == nb.keys()
        for key in nb:
            assert na[key] == approx(nb[key], scale=max(1.0, abs(nb[key])), depth=CFG.n_layers * b["step"],
                                     width=CFG.d_model), key


def _lightning_gpt2_run(run_dir, compiled: bool) -> list[dict]:
    return _lightning_run(run_dir, compiled, make_net=lambda: _gpt2("sdpa"),
                          logits_of=lambda net, ids: net(input_ids=ids, use_cache=False).logits)


@needs_traced_hooks
@pytest.mark.slow
def test_lightning_callback_with_compiled_hf_gpt2_equals_eager(tmp_path):
    eager = _lightning_gpt2_run(tmp_path / "eager", False)
    got, graphs, breaks = _counted(lambda: _lightning_gpt2_run(tmp_path / "compiled", True))
    _assert_same_run(got, eager, graphs, breaks, ["net.transformer.h.0", "net.transformer.h.1"])


class _TorchEncoder(torch.nn.Module):
    """PyTorch's own nn.TransformerEncoder over embeddings: its adapter rebuilds the probabilities in a
    forward hook on each nn.MultiheadAttention from the module's own weights, which dynamo traces."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(CFG.vocab_size, CFG.d_model)
        layer = torch.nn.TransformerEncoderLayer(CFG.d_model, CFG.n_heads, 2 * CFG.d_model, dropout=0.0,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, CFG.n_layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(CFG.d_model, CFG.vocab_size)

    def forward(self, ids):
        return self.head(self.encoder(self.emb(ids)))  # [B, T, V]


def _torch_encoder_run(run_dir, compiled: bool) -> list[dict]:
    torch.manual_seed(0)
    model = _TorchEncoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    net = torch.compile(model, backend=BACKEND) if compiled else model
    gen = torch.Generator().manual_seed(1)
    with TrainingMonitor(net, run_dir, attention_every=ATTENTION_EVERY, every=1, echo=False) as monitor:
        for _ in range(STEPS):
            ids = torch.randint(0, CFG.vocab_size, (4, CFG.max_len), generator=gen)  # [B, T]
            loss = F.cross_entropy(net(ids).reshape(-1, CFG.vocab_size), ids.reshape(-1))
            loss.backward()
            monitor.step(loss, optimizer=opt)
            opt.step()
            opt.zero_grad()
    return _records(run_dir)


# torch 2.4 (measured): the block statistics of a compiled nn.TransformerEncoder come out of the graph as
# bare FunctionalTensors ("Attempting to use FunctionalTensor on its own"), a dynamo bug fixed by 2.13
@needs_traced_hooks
def test_compiled_torch_mha_samples_attention_as_eager(tmp_path):
    eager = _torch_encoder_run(tmp_path / "eager", False)
    got, graphs, breaks = _counted(lambda: _torch_encoder_run(tmp_path / "compiled", True))
    _assert_same_run(got, eager, graphs, breaks, ["encoder.layers.0", "encoder.layers.1"])


def test_gpt2_under_an_older_dynamo_warns_once_and_keeps_the_rest(tmp_path, monkeypatch):
    """On a torch whose dynamo cannot trace the adapters' hooks (TRACED_HOOKS False: before 2.13) a
    compiled GPT-2 is monitored without attention samples, said once; the flag is what decides. (The
    flag's other value is test_compiled_hf_gpt2_run_equals_eager's: samples, and any RuntimeWarning an
    error there, so nothing said.)"""
    import diagnose.adapters.base as base

    monkeypatch.setattr(base, "TRACED_HOOKS", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = _train_gpt2(tmp_path, "compiled", "sdpa")
    said = [w for w in caught if "not sampled under torch.compile for hf-gpt2" in str(w.message)]
    assert len(said) == 1
    assert not any("attention" in r for r in records)
    assert all(list(r["layers"]) == ["transformer.h.0", "transformer.h.1"] for r in records)
