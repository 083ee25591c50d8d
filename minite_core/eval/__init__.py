"""lm-eval integration: the `minite` model (an lm-eval LM running a checkpoint under an execution profile) and
task YAML built at run time from the DAG's held-out JSONL.

Importing this package registers `minite` with lm-eval's model registry (the one import-time side effect in the
package, and the reason it exists: `lm_eval.simple_evaluate(model="minite", ...)` looks models up by name).
"""
from minite_core.eval.lm import MiniteLM, eval_profile
from minite_core.eval.tasks import TASKS, TaskSpec, build_tasks, process_results_gen, task_manager

__all__ = ["MiniteLM", "eval_profile", "TASKS", "TaskSpec", "build_tasks", "process_results_gen", "task_manager"]
