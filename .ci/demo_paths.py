"""`make demo-paths`: the demo under each CPU kernel path gives the same lessons and flags.

Runs `diagnose demo` once per ATEN_CPU_CAPABILITY value given (two at a time: the demo runs on one
thread), then compares what the demo concludes, leaving out the digits that rounding may move:
each lesson's claim and its verdict rows (checks, monitor alerts, flags), and for each of the three
main models every head's verdict (significant, negligible, its verdict in words, compensated) and every flag. Exits 1 on any difference.

    python .ci/demo_paths.py OUT_DIR avx512 avx2 default
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from diagnose._head_label import head_label


def run(out: Path, path: str) -> Path:
    folder = out / path
    env = {**os.environ, "ATEN_CPU_CAPABILITY": path, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "diagnose", "demo", "--out", str(folder)], env=env,
                          capture_output=True, text=True)
    (out / f"{path}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"error: the demo failed under ATEN_CPU_CAPABILITY={path} (exit {done.returncode}); "
                         f"see {out / f'{path}.log'}")
    print(f"  {path:8s} demo done in {time.perf_counter() - start:.0f} s", flush=True)
    return folder


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
    out, paths = Path(argv[0]), argv[1:]
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        folders = dict(zip(paths, pool.map(lambda p: run(out, p), paths)))
    found = {p: verdicts(f) for p, f in folders.items()}
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
