"""`diagnose heads`: which heads matter, with significance, beside what their heatmaps suggest."""

from __future__ import annotations

import click

from ._options import (
    batch_size_option,
    min_effect_option,
    attention_options,
    check_outputs,
    data_option,
    html_option,
    max_length_option,
    method_option,
    model_options,
)
from diagnose.ablation.methods import METHODS  # noqa: E402  (the registry's live names; no torch)

# literal so that --help needs no torch; a test checks them against the library's own lists
TASKS = ("classification", "lm")
RANKINGS = ("second_order_delta_loss", "estimated_delta_loss", "grad_importance_raw")
UNVERIFIED = "not verified"  # a --fast head's effect cell
SHOWN_CONTRADICTS = 20  # heads whose verdict depends on the method named on the terminal (all are in the JSON)


@click.command()
@model_options
@data_option(required=True)
@max_length_option
@attention_options
@click.option("--task", type=click.Choice(TASKS), default=None,
              help="How to score: classification (labels [N] or [N, T]) or lm (next token). "
                   "Default: the checkpoint's task, else guessed from the labels.")
@method_option()
@click.option("--methods", default=None, metavar="NAMES",
              help="Sweep under each of these methods, e.g. zero,mean,resample, and report for each head whether "
                   "its verdict (matters, negligible, undecided) agrees; the first one's table is printed and "
                   "written (overrides --method).")
@click.option("--draws", type=int, default=None,
              help="resample: donors per example, whose outcomes are averaged (default 2, at most 1000).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of resample's donors and of the bootstrap intervals (0 to 2**63 - 1).")
@click.option("--json", "json_path", type=click.Path(path_type=str), default=None,
              help="Write the diagnose.heads/2 JSON here (atomically).")
@batch_size_option
@click.option("--fast", is_flag=True, default=False,
              help="Rank heads by a second-order estimate of their delta loss (one clean pass with "
                   "per-example gradients); ablate only the --top ones exactly.")
@click.option("--rank-by", type=click.Choice(RANKINGS), default=RANKINGS[0], show_default=True,
              help="The --fast estimate: second order (best on real models), first order, or gradient "
                   "importance (Michel et al.; better on tiny models whose loss is near 0).")
@click.option("--correction", type=click.Choice(("holm", "bh")), default="holm", show_default=True,
              help="Multiple-testing correction across heads: holm (family-wise) or bh (Benjamini-Hochberg, "
                   "false discovery rate).")
@min_effect_option()
@click.option("--top", type=click.IntRange(min=0), default=None, help="Heads to verify with --fast (default 5).")
@click.option("--together", "groups", multiple=True, metavar="HEADS",
              help="Also close these heads at once, e.g. L0.H3,L0.H0 (repeatable): a head that costs nothing "
                   "alone but more beside another was its backup.")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Cap on the estimated memory of one sweep step, e.g. 2GB or 512MB; the examples per pass "
                   "and heads per forward are chosen to fit it and the free memory (default: the free memory). "
                   "Resample's donor table (examples x --draws) must fit it too, checked before the first forward.")
@click.option("--direct/--no-direct", default=True, show_default=True,
              help="Also measure each head's direct effect (removed on its direct path to the output only, the "
                   "scale of every norm on that path frozen), self-repair = direct - total, and flag compensated "
                   "heads.")
@html_option
def heads(model: str, factory: str | None, forward: str | None, trust_pickle: bool, attn_implementation: str | None,
          data: str,
          max_length: int | None, attention_module: str | None, n_heads: int | None, task: str | None,
          method: str, methods: str | None, draws: int | None, seed: int, json_path: str | None,
          batch_size: int | None, fast: bool,
          rank_by: str, correction: str,
          min_effect: float, top: int | None, groups: tuple[str, ...], max_memory: str | None,
          direct: bool, html_path: str | None) -> None:
    """Remove each attention head in turn and measure what the model loses.

    Prints every head ranked by its effect: its verdict (matters: significant and
    outside the negligible band; detectable but negligible; negligible; undecided),
    change in accuracy with 95 % CI, change in loss with the p-value of the test that
    decides (paired permutation test, corrected), KL, the head's role, and the
    attention statistics a heatmap would suggest; then the heads whose heatmap and
    effect disagree, most telling first, and the smallest accuracy effect the data
    can show. Beside the total effect, each head's direct effect: the head removed on its direct
    path to the output only, everything downstream frozen; a head whose direct effect matters
    while its total does not is "compensated" (later layers restore what it writes).

    Under torchrun each process sweeps a shard of the examples (one GPU each with NCCL, else gloo
    on CPUs); the per-example results are gathered, so the output is the same as one process's,
    and only rank 0 prints and writes. Start it with `torchrun ... --no-python diagnose`, not
    `-m diagnose`, which would put the current folder (a model folder's .py files) on the path.

    \b
    Example: diagnose heads demo-out/induction/model.pt --data demo-out/induction/eval.pt --json heads.json
             diagnose heads model.pt --data eval.pt --html heads.html
             diagnose heads model.pt --data eval.pt --together L0.H3,L0.H0
             torchrun --nproc-per-node 4 --no-python diagnose heads model.pt --data eval.pt --json heads.json
    """
    check_outputs({"--json": json_path, "--html": html_path}, inputs=[model, data])  # before the slow imports
    from diagnose.ablation.plan import parse_size

    from diagnose.ablation.methods import check_compared_draws, check_seed

    closed = [parse_heads(g) for g in groups]  # bad names fail before anything is loaded
    compared = parse_methods(methods) if methods is not None else None
    check_seed(seed, "--seed")  # numbers too, before the model is loaded
    check_compared_draws(compared or [method], draws, "--draws")  # a --draws no method uses is said, not ignored
    options = dict(method=compared[0] if compared else method, draws=None if compared else draws, seed=seed,
                   batch_size=batch_size, fast=fast, top=top, correction=correction, min_effect=min_effect,
                   rank_by=rank_by, together=closed, max_memory=parse_size(max_memory, "--max-memory"),
                   direct=direct)
    result, main = _ablate((model, factory, trust_pickle, attn_implementation, data, max_length, attention_module,
                            n_heads, task, forward), options, compared, draws)
    if main:  # under torchrun, rank 0 prints and writes
        _write(result, json_path, html_path)


def _ablate(load_args: tuple, options: dict, compared: list[str] | None, draws: int | None):
    """Join torchrun's group if any, load the model and data (`_load`'s arguments), sweep under one method or
    several; (the result, whether this process is rank 0)."""
    from diagnose.distributed import init_from_env, leave
    from diagnose.ablation import AblationConfig, ablate_heads, ablate_methods

    from ._progress import progress_bar

    ranks, device = init_from_env()  # torchrun: join the group (NCCL on this rank's GPU, else gloo)
    # every rank loads; one failing tells the others, so none is left waiting in a collective
    net, ds, sites, task = ranks.run_local("loading the model and data", lambda: _load(*load_args))
    if device is not None:
        net.to(device)  # after the checks on the CPU; the data stays there, each batch moves when used
    config = AblationConfig(task=task, distributed=ranks.active, **options)
    with progress_bar("ablating heads", shown=ranks.main) as bar:
        if compared:
            result = ablate_methods(net, ds, compared, config=config, draws=draws, sites=sites, progress=bar)
        else:
            result = ablate_heads(net, ds, config=config, sites=sites, progress=bar)
    leave()  # on an error the group stays up until rank 0 has said it (cli.main, say_on_rank0)
    return result, ranks.main


def _write(result, json_path: str | None, html_path: str | None) -> None:
    """The JSON, the table and summary on stdout, and the report."""
    from diagnose.display import plain

    if json_path:
        result.save(json_path)
    _print(result, json_path)
    if html_path:
        from ._report import write_report_noting

        click.echo(f"report: {plain(write_report_noting([result], html_path))}")


def _load(model: str, factory: str | None, trust_pickle: bool, attn_implementation: str | None, data: str,
          max_length: int | None, attention_module: str | None, n_heads: int | None, task: str | None,
          forward: str | None = None) -> tuple:
    """The model, its data, its attention sites and the task, each checked on the CPU."""
    from diagnose.io import check_task, load_data_for, load_model, trial_forward
    from diagnose.objectives import default_task
    from diagnose.sites import find_heads

    net = load_model(model, factory=factory, trust_pickle=trust_pickle, attn_implementation=attn_implementation,
                     forward=forward)
    ds = load_data_for(net, data, max_length=max_length)
    trial_forward(net, ds)
    sites = find_heads(net, attention_module=attention_module, n_heads=n_heads, example=ds.inputs(0, 2))
    task = task or default_task(net, ds)
    check_task(ds, task)
    return net, ds, sites, task


def _print(result, json_path: str | None) -> None:
    from rich.console import Console
    from rich.text import Text

    from diagnose.display import heads_label, plain, text

    out = Console(highlight=False, width=max(Console().width, 132))  # 120 + the direct effect column
    b = result.baseline
    out.print(text(f"{result.model['family']} model, {result.model['n_layers']} layers; {result.task}, {result.method} "
                   f"ablation, {result.n_examples} examples ({result.n_units} scored units); baseline accuracy "
                   f"{b['accuracy']:.2%}, loss {b['loss']:.4f}"
                   + (f", logit diff {b['logit_diff']:.3f} (label - wrong answer)" if "logit_diff" in b else "")))
    from diagnose.reports.view_heads import shared_note

    if shared_note(result.model):
        out.print(text(f"shared layers: {shared_note(result.model)}"))
    corr = result.significance["correction"].upper() if result.significance["correction"] == "bh" else "Holm"
    out.print(_table(result, corr))
    sig = result.significance
    out.print(Text(verdict_sentence(sig, corr)))
    if _direct_note(result):
        out.print(Text(_direct_note(result)))
    if getattr(result, "agreement", None):
        _print_agreement(out, result.agreement)
    if result.fast:
        rho = result.fast["spearman_vs_exact"]["rho"]
        out.print(Text(f"--fast: ranked {len(result.heads)} heads by {result.fast['ranked_by']}, verified the top "
                       f"{result.fast['top']}" + ("" if rho is None else f" (Spearman to exact {rho:+.2f})")))
    for f in result.flags:
        names = heads_label(f.get("heads") or [(f["layer"], f["head"])])
        depends = " [the verdict depends on the method]" if f.get("depends_on_method") else ""
        out.print(Text.assemble(f"{f.get('rank', '-')}. ", (plain(f["kind"]), "bold"),
                                plain(f" {names}: {f['reason']}{depends}")))
    if not result.flags:
        out.print(Text("No head's heatmap contradicts its ablation effect."))
    for g in result.together:
        names = heads_label(g["heads"])
        out.print(Text(f"Closed together {names}: accuracy {g['accuracy']:.2%} ({g['delta_accuracy']:+.2%}), "
                       f"loss {g['loss']:.4f} ({g['delta_loss']:+.4f})"))
    from ._table import print_sections

    print_sections(out, result.sections)  # the analysis steps' tables (diagnose/ablation/analyses.py)
    t = result.timing
    where = f"; JSON: {json_path}" if json_path else ""
    chosen = f", micro-batch {t['micro_batch']}, {t['replication']} head(s) per forward" if "micro_batch" in t else ""
    out.print(text(f"{t['seconds']:.1f} s, {t['forward_passes']} forward passes{chosen}{where}"))


def _table(result, corr: str):
    """Every head ranked by its effect, beside the attention statistics the registry shows in the CLI: the
    declared head fields (diagnose/head_fields.py) and statistics through the one table printer."""
    from diagnose.display import head_label
    from diagnose.head_fields import by_key
    from diagnose.schema import Field
    from diagnose.statistics import role_label, shown

    from ._table import table

    f = by_key()
    # from the registry; a statistic no head has (induction without token ids: NaN, null) takes no column
    stats = [Field(s.name, s.column, s.fmt, per="head") for s in shown("cli")
             if any(_measured(h.attention.get(s.name)) for h in result.heads)]
    diff = "logit_diff" in result.baseline  # the data names wrong answers: Δlogit diff beside Δloss
    # one p: the corrected loss test's, which decides (the accuracy test's is in the JSON, p_value_adjusted)
    columns = [Field("rank", "rank", "s"), Field("label", "head", "s"), f["verdict"], f["role"],
               Field("delta_accuracy", f"{f['delta_accuracy'].label} [95 % CI]", "s"), _cli(f["delta_loss"]),
               *([Field("delta_logit_diff", f"{f['delta_logit_diff'].label} [95 % CI]", "s")] if diff else []),
               Field("p", f"p loss ({corr})", "s"), _cli(f["kl"]), Field("direct", f["direct_delta_loss"].label, "s"),
               *stats]
    # each statistic as narrow as its longest header word (a header wraps), so the effect columns keep their room
    options = {s.key: {"max_width": max(6, *map(len, s.label.split()))} for s in stats}
    options.update({"delta_accuracy": {"min_width": len(UNVERIFIED)},  # "not verified" on one line
                    "verdict": {"max_width": 10},  # "detectable but negligible" wraps, the statistics keep their room
                    "direct": {"overflow": "fold"}})  # narrow: the flag folds rather than push a column off
    rows = []
    for rank, h in enumerate(result.ranked(), 1):
        row = {"rank": str(rank), "label": head_label(h.layer, h.head), "verdict": h.verdict or "",
               "role": role_label(h.role), "delta_accuracy": UNVERIFIED, "delta_loss": "", "delta_logit_diff": "",
               "p": "", "kl": "", "direct": ""}
        if h.verified:
            acc = f["delta_accuracy"]
            lo, hi = h.delta_accuracy_ci
            row.update(delta_accuracy=f"{acc.format(h.delta_accuracy)} [{acc.format(lo)}, {acc.format(hi)}]",
                       delta_loss=h.delta_loss, p=_p(h), kl=h.kl, direct=_direct(h))
            if diff and h.delta_logit_diff is not None:
                ld, (lo, hi) = f["delta_logit_diff"], h.delta_logit_diff_ci
                row["delta_logit_diff"] = f"{ld.format(h.delta_logit_diff)} [{ld.format(lo)}, {ld.format(hi)}]"
        row.update({s.key: _or_blank(h.attention.get(s.key)) for s in stats})
        rows.append(row)
    return table(columns, rows, options)


def _cli(field):
    """A head field as the CLI's table heads it: its label without the unit (the line above names it)."""
    from dataclasses import replace

    return replace(field, unit="")


def verdict_sentence(sig: dict, corr: str) -> str:
    """The verdicts in words: "matters" only when significant and outside the negligible band."""
    n = sig.get("verdicts") or {}
    band = (sig.get("negligible_band") or {}).get("loss")
    within = f" (|Δloss| ≥ {band:.3g})" if band is not None else ""
    return (f"{n.get('matters', 0)} of {sig['n_tested']} heads tested matter: significant on the loss test after "
            f"{corr} correction (alpha {sig['alpha']}) and outside the negligible band{within}; "
            f"{n.get('detectable but negligible', 0)} detectable but negligible (significant, inside the band); "
            f"{n.get('negligible', 0)} negligible; {n.get('undecided', 0)} undecided. "
            f"Note: {sig.get('power_note', '')}.")


def _print_agreement(out, agreement: dict) -> None:
    """Whether each head's verdict is the same under every method, and the heads where it is not."""
    from rich.text import Text

    from diagnose.display import head_label

    names = ", ".join(agreement["methods"])
    rows = {(r["layer"], r["head"]): r for r in agreement["heads"]}
    n_agree = agreement["n_compared"] - agreement["n_depends"]
    line = f"Verdict by method ({names}): {n_agree} of {agreement['n_compared']} heads agree"

    def said(layer: int, head: int) -> str:
        v = rows[(layer, head)]["verdicts"]
        return f"{head_label(layer, head)} ({', '.join(f'{m}: {v[m]}' for m in agreement['methods'])})"

    strong = [tuple(m) for m in agreement.get("contradicts", agreement["depends"])]
    weak = [tuple(m) for m in agreement["depends"] if tuple(m) not in strong]
    if strong:  # named up to SHOWN_CONTRADICTS; the JSON keeps every one
        line += ("; the verdict depends on the method for " + "; ".join(said(*m) for m in strong[:SHOWN_CONTRADICTS])
                 + (f"; and {len(strong) - SHOWN_CONTRADICTS:,} more (agreement.contradicts in the JSON)"
                    if len(strong) > SHOWN_CONTRADICTS else ""))
    if weak:
        line += (f"; {len(weak)}{' more' if strong else ''} head(s) are firm under one method and undecided under "
                 f"another (the data cannot tell, rather than the method): " + "; ".join(said(*m) for m in weak[:6])
                 + (f"; and {len(weak) - 6} more (agreement.depends in the JSON)" if len(weak) > 6 else ""))
    out.print(Text(line + "."))


def parse_methods(text: str) -> list[str]:
    """'zero,mean,resample' -> the names, each a registered method, at least two (ConfigError otherwise)."""
    from diagnose.ablation.methods import get_method
    from diagnose.errors import ConfigError

    names = list(dict.fromkeys(filter(None, (p.strip() for p in text.split(",")))))
    for name in names:
        get_method(name)
    if len(names) < 2:
        raise ConfigError(f"--methods {text!r:.60}: name at least two methods, comma-separated, e.g. zero,mean,resample")
    return names


def parse_heads(text: str) -> list[tuple[int, int]]:
    """'L0.H3,L1.H0' (also L0H3 or 0.3) -> [(0, 3), (1, 0)]."""
    import re

    from diagnose.errors import ConfigError

    heads = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"[Ll]?(\d+)\.?[Hh]?(\d+)", part) if re.search(r"[.Hh]", part) else None
        if m is None:
            raise ConfigError(f"--together {text!r:.60}: {part!r:.40} is not a head; write heads as L<layer>.H<head>, "
                              "comma-separated, e.g. L0.H3,L0.H0")
        heads.append((int(m.group(1)), int(m.group(2))))
    if not heads:
        raise ConfigError(f"--together {text!r:.60} names no head; write e.g. L0.H3,L0.H0")
    return heads


def _direct(h) -> str:
    """The direct effect on the loss, '*' when significant, 'comp.' when compensated (the total hides it;
    the line under the table names those heads in words)."""
    from diagnose.head_fields import by_key

    if h.direct_delta_loss is None:
        return ""
    return by_key()["direct_delta_loss"].format(h.direct_delta_loss) + (" *" if h.direct_significant else "") + (
        " comp." if h.compensated else "")


def _direct_note(result) -> str:
    """One line on the direct effects: the compensated heads, or why none were measured."""
    from diagnose.display import head_label

    d = getattr(result, "direct", None)  # None: a result from before direct effects
    if not d:
        return ""
    if not d.get("measured"):
        return f"Direct effects not measured: {d.get('reason')}"
    hidden = [h for h in result.heads if h.compensated]
    named = ", ".join(f"{head_label(h.layer, h.head)} (direct {h.direct_delta_loss:+.4f}, total {h.delta_loss:+.4f})"
                      for h in hidden)
    return (f"Direct effects ({d['n_heads']} heads, norms on the path frozen): " +
            (f"{len(hidden)} compensated (comp. in the table), their direct effect matters but later layers "
             f"restore it: {named}"
             if hidden else "no head is compensated (none whose direct effect matters while its total does not)"))


def _p(h) -> str:
    from diagnose.head_fields import by_key

    p = h.p_value_loss_adjusted
    return ("" if p is None else by_key()["p_value_loss_adjusted"].format(p)) + (" *" if h.significant else "")


def _measured(v) -> bool:
    return v is not None and v == v  # NaN: the statistic had no rows to measure here


def _or_blank(v):
    return "" if v is None else v
