"""``make demo-fleet``: the e2e scenario for a person to watch, on embedded defaults.

It runs the same ``Fleet`` and ``Scenario`` as e2e/test_e2e_fleet_loop.py (the real control
plane with RBAC, kubectl, helm, operator, engines, Prometheus, S3 on moto, a node agent) and
prints the story as it happens: traffic shifts, drift scores, CompileJob experiments, canary
steps with the analysis values beside their thresholds, promotion, then the rollback of a
slower build. It ends with ``kubectl get md,cj.polymorph.dev,deploy,jobs,pods`` and exits 0 when
every step reached its state (1 otherwise).

``python e2e/demo_fleet.py [--keep DIR]``: ``--keep`` leaves the logs of every process in DIR.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness import NS, Fleet
from scenario import MD, Scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-fleet", description=__doc__)
    parser.add_argument("--keep", type=Path, help="a folder for the logs of every process (kept)")
    args = parser.parse_args(argv)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="polymorph-demo-fleet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

    say(f"starting the fleet (logs in {workdir})")
    with Fleet(workdir) as fleet:
        say("control plane, S3, Prometheus, operator (the chart's ServiceAccount) and node agent are up")
        story = Scenario(fleet, say)
        try:
            story.apply_pinned()
            compiled = story.shift_and_unpin()
            best = (compiled["compilejob"]["status"].get("best") or {}).get("build")
            if best is None:
                say("the CompileJob found no build beyond noise: nothing to roll out")
                return 1
            story.promotion(best)
            say(f"promoted: {best} serves all replicas")
            back = story.drift_back()
            tuned = back["status"]["activeBuild"]["profile"]
            story.manual_then_rollback(tuned)
            say("rolled back: the slower build is gone, the promoted one still serves")
            story.tell_events()
            return_code = 0
        except AssertionError as exc:
            say(f"the story stopped: {exc}")
            return_code = 1
        finally:
            story.close()
        print()
        view = "{.status.activeBuild.id}{'  drift '}{.status.drift.score}{': '}{.status.drift.reasons}{'  '}{.status.rollout.phase}"
        print(f"$ kubectl -n {NS} get md {MD} -o jsonpath='{view}'")
        print(fleet.kubectl("-n", NS, "get", "md", MD, "-o", f"jsonpath={view}", check=False))
        # compilejobs in full: on a real API server the short name cj is CronJob's.
        kinds = "md,cj.polymorph.dev,deploy,jobs,pods"  # cj alone is the CronJob
        print(f"$ kubectl -n {NS} get {kinds}")
        print(fleet.kubectl("-n", NS, "get", kinds, check=False), end="")
    say("done")
    return return_code


if __name__ == "__main__":
    sys.exit(main())
