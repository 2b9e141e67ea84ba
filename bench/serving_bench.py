"""The serving benchmark's own cost on the real vLLM: the load generator's CPU against the engine's.

    scripts/demo                                  # the demo cluster, converged (kimi-h1: real vLLM)
    python bench/serving_bench.py [--concurrency 1,4,16,32] [--rounds 4]

Runs ``deploys/bench.py`` on the demo cluster with ``recipes/demo.yaml``'s tasks at the given
concurrencies (each task ``--rounds`` times a level, more where that is fewer than twice the
level's concurrency). The demo's vLLM topology has no router: every request goes to kimi-h1's
engine, on the host the generator runs on, so the two CPU figures share one host's two cores and
one clock. Prints per level the requests, the wall time, the generator's CPU seconds (vLLM's
``bench serve``, import excluded) and the engine's (the unit's processes), the generator's share
of the two, TTFT p50, output tokens/s and the success rate; then the generator's start (importing
vLLM), once per run, and the whole run's wall time, all measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    data["benchmark"] |= {"concurrency": [int(c) for c in args.concurrency.split(",")], "rounds": args.rounds}
    with tempfile.TemporaryDirectory() as folder:
        recipe, report = Path(folder) / "recipe.yaml", Path(folder) / "bench.json"
        recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        began = time.monotonic()
        ran = subprocess.run(
            [
                str(ROOT / ".venv/bin/pyinfra"),
                "inventories/demo.py",
                "deploys/bench.py",
                "-y",
                "--data",
                f"kimi_recipe={recipe}",
                "--data",
                f"kimi_bench_json={report}",
                "--data",
                f"kimi_bench_png={Path(folder) / 'bench.png'}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        took = time.monotonic() - began
        if ran.returncode != 0:
            sys.exit(f"deploys/bench.py failed (is the demo cluster up? scripts/demo):\n{ran.stdout[-3000:]}")
        rep = json.loads(report.read_text(encoding="utf-8"))
    print("conc  requests  wall s  generator CPU s  engine CPU s  generator share  TTFT p50 s  out tok/s  success")
    gen_total = eng_total = 0.0
    for lv in rep["targets"]["local"]:
        gen, eng = lv["generator_cpu_s"] or 0.0, lv["engine_cpu_s"] or 0.0
        gen_total, eng_total = gen_total + gen, eng_total + eng
        share = gen / (gen + eng) if gen + eng else 0.0
        ttft, tok, ok = lv["ttft_p50_s"], lv["output_tok_s"], lv["success_rate"]
        print(
            f"{lv['concurrency']:>4}  {lv['requests']:>8}  {lv['wall_s']:>6.2f}  {gen:>15.3f}  {eng:>12.3f}  "
            f"{share:>15.1%}  {ttft:>10.3f}  {tok:>9.1f}  {ok:.0%}"
        )
    share = gen_total / (gen_total + eng_total) if gen_total + eng_total else 0.0
    print(f"all levels: generator {gen_total:.2f} s of CPU, engine {eng_total:.2f} s: generator's share {share:.1%}")
    print(f"generator start (vLLM imported, once a run): {rep['generator_load_cpu_s']:.2f} s of CPU")
    print(f"whole run, controller to report: {took:.1f} s")


if __name__ == "__main__":
    main()
