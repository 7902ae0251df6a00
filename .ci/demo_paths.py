"""`make demo-paths`: the demo under each CPU kernel path gives the same lessons and flags.

Runs what `diagnose demo` concludes once per ATEN_CPU_CAPABILITY value given, then compares it,
leaving out the digits that rounding may move: each lesson's claim and its verdict rows (checks,
monitor alerts, flags), and for each of the three main models every head's verdict (significant,
negligible, its verdict in words, compensated) and every flag and check. Exits 1 on any difference.

Only what depends on the path is computed per path, in jobs of one thread each, two at a time, the
longest first (so the two cores stay busy to the end): per path, the three shipped models' sweeps,
checks and circuit with the two lessons on those models, which reuse them (`run_demo` with those
lessons only and no report; nothing retrained), and each group of lessons that trains on its own
(the lesson pairs are trained on the spot, which is what can differ per path). A group whose
compared verdicts the models' wiring decides whatever their weights (WIRING) trains on the first
path only; each other path checks those weights under its own kernels. The report, which only lays
out those files, is not rendered per path (tests render it).

    python .ci/demo_paths.py OUT_DIR avx512 avx2 default
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from diagnose._head_label import head_label


def lesson_models() -> dict[str, set[str]]:
    """Each lesson's key and the variants (models) it compares, in the demo's order."""
    from diagnose.demo import _lessons

    return {les.key: {les.a, les.b} for les in _lessons.LESSONS}


def on_shipped() -> list[str]:
    """The lessons on shipped models only (nothing trained): the `main` job runs them, on the sweeps and
    the circuit it makes of those models anyway (run_demo hands them over)."""
    from diagnose.demo import _lessons

    vs = _lessons.variants()
    return [key for key, names in lesson_models().items() if not names & set(vs)]


def groups() -> list[list[str]]:
    """The other lessons in groups that share no trained variant (each group one job), longest first."""
    from diagnose.demo import _lessons

    vs = _lessons.variants()
    out: list[tuple[set[str], list[str]]] = []
    for key, names in lesson_models().items():
        if key in on_shipped():
            continue
        joined = [g for g in out if g[0] & names]
        merged = (names.union(*(g[0] for g in joined)), [k for g in joined for k in g[1]] + [key])
        out = [g for g in out if g not in joined] + [merged]

    def cost(names: set[str]) -> float:  # trained steps x layers x width^2 (shipped ones cost ~0)
        return sum(vs[n].train.steps * vs[n].model.n_layers * vs[n].model.d_model ** 2 for n in names if n in vs)

    return [keys for names, keys in sorted(out, key=lambda g: -cost(g[0]))]


# Lessons whose compared verdicts (`verdicts`: the claim and the "s" rows) the models' wiring decides
# whatever their weights: the scaling check measures the scale each attention applies, the ratio of the
# softmax's input to q @ k^T, which is the same for any weights (diagnose/checks/_scaling.py), and a
# problem's title says only in how many layers it is missing. So this pair (the widest models: over half
# of all the training here) trains on the first path only, and each other path checks those weights
# under its own kernels. The lessons whose verdicts are their runs' alerts train on every path.
WIRING = ("scaling",)


def _trained_elsewhere(source: Path, v, runs_dir: Path, cache: dict):
    """v as the first path trained it (its weights and run, from source), measured here."""
    import torch

    from diagnose.demo import _lessons, _shipped
    from diagnose.zoo import Transformer
    from diagnose.zoo.train import evaluate

    _, ev = _lessons._split(v, cache)
    model = Transformer(v.model)
    model.load_state_dict(torch.load(source / "weights" / f"{v.name}.pt", weights_only=True))
    model.eval()  # as train() leaves it
    run_dir = _shipped.copy_run(source / "runs" / v.name, runs_dir / v.name)
    loss, accuracy = evaluate(model, ev)
    return _lessons.Trained(v, model, ev, run_dir, accuracy, loss)


def job(folder: Path, kind: str, source: Path | None = None) -> None:
    """One job, in this process (ATEN_CPU_CAPABILITY already set): `main`, or a comma-separated
    group of lesson keys, written to folder/lessons-<first key>/lessons.json. A WIRING group keeps
    its trained weights there (weights/<variant>.pt), or, given `source` (that folder on the first
    path), takes them from there instead of training."""
    import torch

    from diagnose.demo import _lessons, _shipped, demo_variants, run_demo, run_lessons

    torch.set_num_threads(1)
    if kind == "main":  # the shipped models' sweeps, checks and circuit, and the lessons on them (lessons.json)
        run_demo(folder, lessons=on_shipped(), report=False, log=lambda _: None)
        return
    keys = kind.split(",")
    here = folder / f"lessons-{keys[0]}"
    needed = {n for les in _lessons.LESSONS if les.key in keys for n in (les.a, les.b)}
    vs = _lessons.variants()
    trained, cache = {}, {}
    for v in demo_variants():  # the shipped models a lesson uses as they are, as run_demo reuses them
        names = {v.name} | ({vs["positions"].name} if _shipped.recipe(v) == _shipped.recipe(vs["positions"]) else set())
        if names & needed:
            t = _lessons.shipped_variant(v, here / "runs", cache)
            trained.update(dict.fromkeys(names & needed, t))
    if set(keys) <= set(WIRING):
        for name in sorted(needed - set(trained)):
            if source is not None:
                trained[name] = _trained_elsewhere(source, vs[name], here / "runs", cache)
                continue
            trained[name] = t = _lessons.train_variant(vs[name], here / "runs", cache)
            (here / "weights").mkdir(parents=True, exist_ok=True)
            torch.save(t.model.state_dict(), here / "weights" / f"{name}.pt")
    run_lessons(here, only=keys, trained=trained, log=lambda _: None)


def run(out: Path, path: str, kind: str, source: str | None = None, ended: threading.Event | None = None) -> None:
    """One job under ATEN_CPU_CAPABILITY=path, in a process of its own. A WIRING group's: on the first
    path it sets `ended` when it ends; elsewhere (source: the first path) it waits for that, then
    checks the weights trained there."""
    folder = out / path
    env = {**os.environ, "ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": "1"}
    name = kind.split(",")[0]
    extra = ["--weights-from", str(out / source / f"lessons-{name}")] if source else []
    try:
        if source and ended is not None:
            ended.wait()
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--job", str(folder), kind, *extra], env=env,
                              capture_output=True, text=True)
    finally:
        if not source and ended is not None:
            ended.set()
    (out / f"{path}-{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"error: the demo's {kind} failed under ATEN_CPU_CAPABILITY={path} (exit {done.returncode}); "
                         f"see {out / f'{path}-{name}.log'}")
    how = f" (checking the weights trained under {source})" if source else ""
    print(f"  {path:8s} {kind:22s} done in {time.perf_counter() - start:.0f} s{how}", flush=True)


def schedule(paths: list[str], lesson_groups: list[list[str]]) -> list[tuple[str, str, str | None]]:
    """The jobs, (path, kind, the path whose trained weights it checks, or None), longest first: each
    group of lessons on every path, a WIRING group trained on the first path only, then `main` on
    every path, then the WIRING groups checked on the other paths (by then their weights are written)."""
    kinds = [",".join(keys) for keys in lesson_groups]
    wiring = [kind for keys, kind in zip(lesson_groups, kinds) if set(keys) <= set(WIRING)]
    jobs = [(path, kind, None) for kind in kinds for path in (paths[:1] if kind in wiring else paths)]
    jobs += [(path, "main", None) for path in paths]
    return jobs + [(path, kind, paths[0]) for kind in wiring for path in paths[1:]]


def merge(folder: Path, lesson_groups: list[list[str]]) -> None:
    """folder/lessons.json: every group's lessons and the `main` job's (written there), in the demo's order."""
    from diagnose.demo import _lessons

    files = [folder / "lessons.json"] + [folder / f"lessons-{keys[0]}" / "lessons.json" for keys in lesson_groups]
    found = {les["key"]: les for f in files for les in json.loads(f.read_text())["lessons"]}
    order = list(lesson_models())
    (folder / "lessons.json").write_text(json.dumps({"schema": _lessons.SCHEMA, "lessons": [found[k] for k in order]},
                                                    indent=1, ensure_ascii=False))


def verdicts(folder: Path) -> dict:
    """What the demo concludes, without the numbers rounding may move."""
    lessons = json.loads((folder / "lessons.json").read_text())["lessons"]
    out: dict = {}
    for les in lessons:
        out[f"lesson {les['key']}"] = {"claim": les["claim"], "a": les["a"], "b": les["b"],
                                       **{r["metric"]: [r["a"], r["b"]] for r in les["rows"] if r["fmt"] == "s"}}
    for model in ("induction", "order", "padding"):
        heads = json.loads((folder / model / "heads.json").read_text())
        out[f"heads {model}"] = {
            "verdicts": [f"{head_label(h['layer'], h['head'])}:{'S' if h['significant'] else '-'}{'N' if h['negligible'] else '-'}"
                         f":{h.get('verdict')}:{'C' if h.get('compensated') else '-'}" for h in heads["heads"]],
            "flags": sorted(f"{f['kind']} {head_label(f.get('layer'), f.get('head'))}" for f in heads["flags"])}
        checks = json.loads((folder / model / "checks.json").read_text())
        out[f"checks {model}"] = {"findings": sorted(f"{f['check']}:{f['severity']}: {f['title']}" for f in checks["findings"]),
                                  "passed": sorted(checks["passed"]), "skipped": sorted(str(s.get("check")) for s in checks["skipped"])}
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--job"]:
        job(Path(argv[1]), argv[2], Path(argv[4]) if argv[3:4] == ["--weights-from"] else None)
        return 0
    out, paths = Path(argv[0]), argv[1:]
    out.mkdir(parents=True, exist_ok=True)
    lesson_groups = groups()
    jobs = schedule(paths, lesson_groups)
    # a WIRING group's job on another path starts once the first path's has ended (its weights written)
    ended = {kind: threading.Event() for _, kind, source in jobs if source}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda j: run(out, *j, ended.get(j[1])), jobs))
    for path in paths:
        merge(out / path, lesson_groups)
    found = {p: verdicts(out / p) for p in paths}
    (out / "verdicts.json").write_text(json.dumps(found, indent=1, ensure_ascii=False))
    first = paths[0]
    bad = [(p, key) for p in paths[1:] for key in found[first] if found[p].get(key) != found[first][key]]
    for p, key in bad:
        print(f"differs under {p} vs {first}: {key}\n  {first}: {found[first][key]}\n  {p}: {found[p].get(key)}")
    if bad:
        return 1
    print(f"the demo's lessons and flags are the same under {', '.join(paths)} ({len(found[first])} items; "
          f"{out / 'verdicts.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
