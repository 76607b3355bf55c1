"""Every registered task x built-in trainer x preset x profile, resolved (the recipes fixture).

``recipes_before.json`` was written by ``python -m tests.optima_trainers.config.recipe_capture OUT``
from the code before the trainers' per-task recipes moved out of ``TaskSpec.presets``;
``test_recipes.py`` resolves the same cases now and compares. Rewrite the fixture only for a change
meant to alter a resolved configuration (and say which in the commit).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

BUILT_IN_TRAINERS = ("grpo", "idpo", "isft", "isft-dpo")
PRESETS = ("code", "paper")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaf names to values (an empty mapping stays a leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve_all() -> dict[str, dict[str, Any]]:
    """``"task trainer preset profile"`` to the flattened, JSON-plain resolved configuration, for
    every registered task (and the template plugin's) on a CPU (``device="cpu"``)."""
    import optima_task_template

    from optima_env.registry import get_plugin_manager, task_specs, trainer_specs
    from optima_trainers.config.train import PROFILES, resolve_config

    pm = get_plugin_manager()
    pm.register(optima_task_template, name="template")
    tasks, trainers = task_specs(pm), trainer_specs(pm)
    cases = {}
    for task in sorted(tasks):
        for trainer in BUILT_IN_TRAINERS:
            for preset in PRESETS:
                for profile in sorted(PROFILES):
                    config = resolve_config(
                        tasks[task], trainers[trainer], preset=preset, profile=profile, device="cpu",
                        **({"pm": pm} if "pm" in resolve_config.__kwdefaults__ else {}),
                    )  # fmt: skip
                    cases[f"{task} {trainer} {preset} {profile}"] = json.loads(
                        json.dumps(flatten(config.to_dict()))
                    )
    return cases


def expand(fixture: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The full cases of a fixture written by :func:`main`."""
    base = fixture["base"]
    return {
        name: {
            **{k: v for k, v in base.items() if k not in case["absent"]},
            **case["differs"],
        }
        for name, case in fixture["cases"].items()
    }


def main(out: str) -> None:
    cases = resolve_all()
    base_name = sorted(cases)[0]
    base = cases[base_name]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    fixture = {
        "about": f"resolve_config(...).to_dict(), flattened, of {len(cases)} cases, written by "
        f"tests/optima_trainers/config/recipe_capture.py at {commit or '?'} (recipes still in "
        "TaskSpec.presets); each case lists its differences from 'base' (the case 'base_case').",
        "base_case": base_name,
        "base": base,
        "cases": {
            name: {
                "differs": {k: v for k, v in case.items() if k not in base or base[k] != v},
                "absent": sorted(set(base) - set(case)),
            }
            for name, case in sorted(cases.items())
        },
    }
    assert expand(fixture) == cases
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
