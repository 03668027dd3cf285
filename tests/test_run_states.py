"""A run's states and phases are named once (kaiyuan_recipes/run_states.py): the words `kaiyuan status` prints come
from the enums, and no module spells them itself (a second spelling drifts: `startswith("running")` matched
every alive state by accident of wording)."""

import json
import re
from pathlib import Path

import kaiyuan_recipes
from kaiyuan_recipes.launch.slurm import STATES, run_state
from kaiyuan_recipes.run_states import ALIVE, Phase, RunState

PACKAGE = Path(kaiyuan_recipes.__file__).parent
SPELT_OUT = re.compile(r"""["'](running — supervisor lost|setting up|stopped before its first step)\b|"""
                       r"""startswith\(["']running""")


def test_no_module_spells_a_run_state_or_phase_itself():
    spelt = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "run_states.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if SPELT_OUT.search(line)]
    assert not spelt, "\n".join(spelt)


def test_states_are_their_words_in_json_and_back():
    record = json.loads(json.dumps({"state": RunState.SUPERVISOR_LOST, "phase": Phase.STOPPED_BEFORE_FIRST_STEP}))
    assert record == {"state": "running — supervisor lost", "phase": "stopped before its first step"}
    assert record["state"] in ALIVE and RunState(record["state"]) is RunState.SUPERVISOR_LOST
    assert {RunState.RUNNING: 1}.get("running") == 1  # a record read back finds its state in a table of them
    assert Phase.is_setting_up(f"{Phase.SETTING_UP}: building dataset indices")
    assert not Phase.is_setting_up(Phase.TRAINING)


def test_every_slurm_state_is_a_run_state():
    ended = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"]
    for slurm_state in [*STATES, *ended]:
        for stopped in (False, True):
            assert isinstance(run_state(slurm_state, stopped), RunState), slurm_state
