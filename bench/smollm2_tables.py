"""The tables of docs/real-model.md's SmolLM2 section, from the JSONs `diagnose heads` wrote (issue 32, item 4).

Nothing here measures: it reads what the CLI wrote and prints Markdown, so that anyone who reruns the
commands gets the tables from their own files. The files (each optional; the docs' commands write them):

- --ioi:      diagnose heads smol --data ioi.pt --methods zero,mean,resample --json ioi.json: the exact sweep
              under zero ablation with direct effects, attention statistics and the --fast estimate of every
              head, and each head's verdict under the three methods (agreement); without --methods the
              agreement table is left out
- --fast:     diagnose heads smol --data ioi.pt --fast --top 10 --json ioi-fast.json (the same data)
- --repeated: diagnose heads smol --data repeated.pt --json repeated.json

Where `/usr/bin/time -v` wrote its report beside a JSON as <name>.err (the docs' commands do), its CPU time
and peak memory are printed with the JSON's own timing.

Run: .venv/bin/python bench/smollm2_tables.py --ioi ioi.json --fast ioi-fast.json --repeated repeated.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from scipy.stats import spearmanr

from diagnose._head_label import head_label

TOP = 10


def name(h: dict) -> str:
    return head_label(h["layer"], h["head"])


def ci(value: float | None, interval: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" + (f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "")


def cost(path: Path, doc: dict) -> str:
    """The run's own timing from the JSON, and CPU time and peak memory from /usr/bin/time -v's report."""
    t = doc["timing"]
    out = f"{doc['n_examples']} examples, {t['seconds']:.0f} s of sweep in {t['forward_passes']} forward passes"
    log = path.with_suffix(".err")
    if log.exists():
        text = log.read_text(errors="replace")
        user = re.search(r"User time \(seconds\): ([\d.]+)", text)
        system = re.search(r"System time \(seconds\): ([\d.]+)", text)
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        if user and system and wall and peak:
            out += (f"; the whole command {float(user[1]) + float(system[1]):.0f} CPU-s, {wall[1]} wall, "
                    f"peak {int(peak[1]) / 2**20:.2f} GB")
    return out


def verdicts(heads: list[dict]) -> str:
    counts: dict[str, int] = {}
    for h in heads:
        if h["verified"]:
            counts[h["verdict"]] = counts.get(h["verdict"], 0) + 1
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def ioi_tables(path: Path, doc: dict) -> None:
    heads, base = doc["heads"], doc["baseline"]
    print(f"### IOI, exact sweep (`{path.name}`)\n\n{cost(path, doc)}. Baseline: accuracy {base['accuracy']:.1%}, "
          f"loss {base['loss']:.3f}, logit diff {base.get('logit_diff', float('nan')):+.3f}. Verdicts of the "
          f"{len(heads)} heads: {verdicts(heads)}; compensated: {sum(bool(h['compensated']) for h in heads)}.\n")
    print("| head | Δloss [95 % CI] | Δlogit diff [95 % CI] | direct Δloss [95 % CI] | self_repair | compensated "
          "| verdict | role |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for h in sorted(heads, key=lambda h: -h["delta_loss"])[:TOP]:
        print(_effect_row(h))
    print(f"\nThe {TOP} largest direct effects:\n\n| head | direct Δloss [95 % CI] | total Δloss [95 % CI] "
          "| self_repair | compensated | verdict |\n| --- | --- | --- | --- | --- | --- |")
    measured = [h for h in heads if h["direct_delta_loss"] is not None]
    for h in sorted(measured, key=lambda h: -h["direct_delta_loss"])[:TOP]:
        print(f"| {name(h)} | {ci(h['direct_delta_loss'], h['direct_delta_loss_ci'])} | "
              f"{ci(h['delta_loss'], h['delta_loss_ci'])} | {h['self_repair']:+.3f} | "
              f"{'yes' if h['compensated'] else 'no'} | {h['verdict']} |")
    _listed("Compensated (direct effect matters, total does not)", [h for h in heads if h["compensated"]],
            lambda h: f"{name(h)} (direct {h['direct_delta_loss']:+.3f}, total {h['delta_loss']:+.3f})")
    _listed("Detectable but negligible", [h for h in heads if h["verdict"] == "detectable but negligible"],
            lambda h: f"{name(h)} ({ci(h['delta_loss'], h['delta_loss_ci'])})")


def _effect_row(h: dict) -> str:
    return (f"| {name(h)} | {ci(h['delta_loss'], h['delta_loss_ci'])} | "
            f"{ci(h.get('delta_logit_diff'), h.get('delta_logit_diff_ci'))} | "
            f"{ci(h['direct_delta_loss'], h['direct_delta_loss_ci'])} | "
            f"{'-' if h['self_repair'] is None else format(h['self_repair'], '+.3f')} | "
            f"{'yes' if h['compensated'] else 'no'} | {h['verdict']} | {h['role']} |")


def _listed(title: str, heads: list[dict], show) -> None:
    heads = sorted(heads, key=lambda h: -abs(h["delta_loss"]))
    shown = ", ".join(show(h) for h in heads[:12]) + (f", and {len(heads) - 12} more" if len(heads) > 12 else "")
    print(f"\n{title}: {len(heads)} head(s){': ' + shown if heads else ''}.")


def fast_table(exact: dict, fast: dict, path: Path) -> None:
    """--fast's estimate for every head against the exact Δloss, and the exact top 10 among its verified top."""
    if fast["n_examples"] != exact["n_examples"] or len(fast["heads"]) != len(exact["heads"]):
        raise SystemExit(f"{path}: {fast['n_examples']} examples and {len(fast['heads'])} heads, against the exact "
                         f"sweep's {exact['n_examples']} and {len(exact['heads'])}: run both on the same data")
    est = {name(h): h[fast["fast"]["ranked_by"]] for h in fast["heads"]}
    true = {name(h): h["delta_loss"] for h in exact["heads"]}
    keys = sorted(true)
    rho, _ = spearmanr([est[k] for k in keys], [true[k] for k in keys])
    exact_top = sorted(true, key=lambda k: -true[k])[:TOP]
    verified = {name(h) for h in fast["heads"] if h["verified"]}
    fast_top = sorted(est, key=lambda k: -est[k])[:TOP]
    print(f"\n### `--fast` against the exact sweep (`{path.name}`)\n\n{cost(path, fast)}; ranked by "
          f"{fast['fast']['ranked_by']}. Spearman over all {len(keys)} heads: {rho:+.3f}. Top-{TOP} recall "
          f"(the exact top {TOP} among the estimate's top {TOP}): {len(set(exact_top) & set(fast_top))}/{TOP}; "
          f"among the {len(verified)} heads `--top` verified: {len(set(exact_top) & verified)}/{TOP}. "
          f"Spearman between the estimate and the exact Δloss on the verified heads (the JSON's): "
          f"{fast['fast']['spearman_vs_exact']['rho']:+.3f}.\n")
    print("| exact rank | head | exact Δloss | estimate | estimate's rank |\n| --- | --- | --- | --- | --- |")
    rank = {k: i + 1 for i, k in enumerate(sorted(est, key=lambda k: -est[k]))}
    for i, k in enumerate(exact_top):
        print(f"| {i + 1} | {k} | {true[k]:+.3f} | {est[k]:+.3f} | {rank[k]} |")


def methods_table(path: Path, doc: dict) -> None:
    agree = doc["agreement"]
    rows, methods = agree["heads"], agree["methods"]
    matters = {m: sum(r["verdicts"][m] == "matters" for r in rows) for m in methods}
    same = sum(r["agree"] is True for r in rows)
    print(f"\n### Zero, mean and resample ablation (`{path.name}`)\n\n{cost(path, doc)}. "
          f"{same} of {agree['n_compared']} heads get the same verdict under {', '.join(methods)}; "
          f"{agree['n_depends']} depend on the method, of which {len(agree['contradicts'])} contradict (matters "
          f"under one, negligible under another). Heads that matter: "
          f"{', '.join(f'{m} {n}' for m, n in matters.items())}.\n")
    print("| head | " + " | ".join(methods) + " | agree |\n|" + " --- |" * (len(methods) + 2))
    contra = {tuple(c) for c in agree["contradicts"]}
    top = sorted(rows, key=lambda r: -r["delta_loss"][methods[0]])[:TOP]
    for r in top + [r for r in rows if (r["layer"], r["head"]) in contra and r not in top]:
        cells = [f"{ci(r['delta_loss'][m], r['delta_loss_ci'][m])}, {r['verdicts'][m]}" for m in methods]
        print(f"| {name(r)} | " + " | ".join(cells) + f" | {'yes' if r['agree'] else 'no'} |")


def repeated_table(path: Path, doc: dict) -> None:
    """The heads with the highest induction score against those whose removal hurts the second copy most."""
    heads = doc["heads"]
    by_ind = sorted(heads, key=lambda h: -(h["attention"].get("induction") or 0.0))
    by_loss = sorted(heads, key=lambda h: -h["delta_loss"])
    loss_rank = {name(h): i + 1 for i, h in enumerate(by_loss)}
    ind_rank = {name(h): i + 1 for i, h in enumerate(by_ind)}
    both = {name(h) for h in by_ind[:TOP]} & {name(h) for h in by_loss[:TOP]}
    rho = doc["correlations"]["induction"]["rho"]
    base = doc["baseline"]
    print(f"\n### Repeated random tokens (`{path.name}`)\n\n{cost(path, doc)}, {doc['n_units']} scored tokens. "
          f"Baseline: accuracy {base['accuracy']:.1%} on the second copy, loss {base['loss']:.3f}. Verdicts: "
          f"{verdicts(heads)}. {len(both)} of the top {TOP} by induction score are among the top {TOP} by Δloss "
          f"({', '.join(sorted(both)) or 'none'}); Spearman between induction score and Δloss over all heads: "
          f"{rho:+.3f}.\n")
    print("| head | induction | duplicate_token | prev_token | Δloss [95 % CI] | Δloss rank | verdict | role |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for h in by_ind[:TOP]:
        print(_stat_row(h, loss_rank))
    print(f"\nThe {TOP} heads whose removal hurts the second copy most:\n\n| head | Δloss [95 % CI] | induction "
          "| induction rank | direct Δloss | verdict | role |\n| --- | --- | --- | --- | --- | --- | --- |")
    for h in by_loss[:TOP]:
        print(f"| {name(h)} | {ci(h['delta_loss'], h['delta_loss_ci'])} | {h['attention'].get('induction', 0):.3f} "
              f"| {ind_rank[name(h)]} | {ci(h['direct_delta_loss'], None)} | {h['verdict']} | {h['role']} |")
    _listed("Compensated (direct effect matters, total does not)", [h for h in heads if h["compensated"]],
            lambda h: f"{name(h)} (direct {h['direct_delta_loss']:+.3f}, total {h['delta_loss']:+.3f})")
    fast = doc["correlations"].get("second_order_delta_loss") or {}
    if fast.get("rho") is not None:
        print(f"\nThe --fast estimate (second order) against the exact Δloss over all {fast['n']} heads, Spearman: "
              f"{fast['rho']:+.3f}.")


def _stat_row(h: dict, loss_rank: dict[str, int]) -> str:
    a = h["attention"]
    return (f"| {name(h)} | {a.get('induction', 0):.3f} | {a.get('duplicate_token', 0):.3f} | "
            f"{a.get('prev_token', 0):.3f} | {ci(h['delta_loss'], h['delta_loss_ci'])} | {loss_rank[name(h)]} | "
            f"{h['verdict']} | {h['role']} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for option in ("ioi", "fast", "repeated"):
        parser.add_argument(f"--{option}", type=Path, help="a diagnose.heads JSON (see the module's docstring)")
    args = parser.parse_args(argv)
    docs = {k: json.loads(v.read_text()) for k, v in vars(args).items() if v is not None}
    if "ioi" in docs:
        ioi_tables(args.ioi, docs["ioi"])
        if docs["ioi"].get("agreement"):
            methods_table(args.ioi, docs["ioi"])
    if "ioi" in docs and "fast" in docs:
        fast_table(docs["ioi"], docs["fast"], args.fast)
    if "repeated" in docs:
        repeated_table(args.repeated, docs["repeated"])


if __name__ == "__main__":
    main()
