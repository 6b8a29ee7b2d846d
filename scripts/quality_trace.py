#!/usr/bin/env python3
"""Where a SPES run falls behind its centralized run, step by step (docs/quality.md, "Where in the
run the gap builds up"), from the runs' metrics.jsonl as scripts/quality_sweep.sh leaves them:

  gap     the mean of the nodes' training cross-entropy minus the centralized run's at the same
          step, averaged over the step and its neighbours (three steps);
  spread  the largest minus the smallest node's cross-entropy at a step;
  own     per layer, the share of a node's routed tokens that go to the experts it owns (from
          run/plan/assignment.txt), averaged over the nodes: exactly 1 / nodes whenever the nodes'
          routers are the same, as right after every round; above it, each router prefers its
          node's own experts. The last column is the mean over the layers.

usage: scripts/quality_trace.py CENTRAL_RUN SPES_RUN [--steps 10,20,21,...]
       e.g. runs/quality-h256/a256/central-s3 runs/quality-h256/a256/spes-s3
"""
import argparse
import glob
import json
import os
import sys


def train_lines(path):
    """step -> (cross-entropy, expert_load) of a metrics.jsonl."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "train":
                    out[r["step"]] = (r["ce"], r["expert_load"])
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{path}: {e}")
    return out


def owned_experts(spes_run):
    """node id -> experts, from the plan's assignment.txt."""
    path = os.path.join(spes_run, "run", "plan", "assignment.txt")
    owned = {}
    try:
        with open(path) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    node, _, experts = line.split()
                    owned[int(node)] = [int(e) for e in experts.split(",")]
    except (OSError, ValueError) as e:
        sys.exit(f"{path}: {e}")
    return owned


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("central")
    ap.add_argument("spes")
    ap.add_argument("--steps", default="10,20,21,30,40,41,60,61,80,81,99")
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    central = train_lines(os.path.join(a.central, "metrics.jsonl"))
    owned = owned_experts(a.spes)
    nodes = {j: train_lines(os.path.join(a.spes, "run", f"node{j}", "metrics.jsonl")) for j in sorted(owned)}
    common = set(central).intersection(*(set(n) for n in nodes.values()))
    missing = [s for s in steps if s not in common]
    if missing:
        sys.exit(f"steps {missing} are not in every run's metrics.jsonl")

    def mean(xs):
        return sum(xs) / len(xs)

    def gap(step):
        window = [t for t in (step - 1, step, step + 1) if t in common]
        return mean([mean([n[t][0] for n in nodes.values()]) - central[t][0] for t in window])

    def own_share(step):
        per_node = []
        for j, n in nodes.items():
            load = n[step][1]
            per_node.append([sum(layer[e] for e in owned[j]) / sum(layer) for layer in load])
        return [mean([p[layer] for p in per_node]) for layer in range(len(per_node[0]))]

    print(f"{a.spes} against {a.central} ({len(nodes)} nodes)")
    print(f"{'step':>5} {'gap':>8} {'spread':>7}  own share per layer (mean)")
    for s in steps:
        ces = [n[s][0] for n in nodes.values()]
        own = own_share(s)
        print(f"{s:>5} {gap(s):>+8.3f} {max(ces) - min(ces):>7.3f}  " + " ".join(f"{x:.3f}" for x in own) +
              f"  ({mean(own):.3f})")


if __name__ == "__main__":
    main()
