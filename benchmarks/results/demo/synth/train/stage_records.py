"""Print each stage's record of the synth retrain (issue 31) from the committed files:
``python benchmarks/results/demo/synth/train/stage_records.py`` (NOTES.md quotes its output)."""

import json
from pathlib import Path

HERE = Path(__file__).parent
KEYS = {
    "rollout/task_score": "sampled task",
    "rollout/tokens": "tokens/episode",
    "select/selected": "selected",
    "mcts/candidates": "candidates",
    "mcts/pairs": "pairs",
    "mcts/gap/task": "task gap",
    "train/steps": "steps",
    "train/eval_pairs": "held-out pairs",
    "train/eval_rewards/accuracies": "held-out accuracy",
    "train/eval_rewards/margins": "held-out margin",
}

for run in ("idpo", "isft-dpo", "isft"):
    state = json.loads((HERE / run / "state.json").read_text())
    print(f"{run}: status {state['status']}, phase seconds {sum(sum(t.values()) for t in state['timings'].values()):.1f}")
    for stage, timings in state["timings"].items():
        metrics = json.loads((HERE / run / stage / "result.json").read_text()).get("metrics", {})
        shown = ", ".join(f"{label} {metrics[k]:.4g}" for k, label in KEYS.items() if k in metrics)
        print(f"  {stage} ({sum(timings.values()):.1f} s): {shown}")
