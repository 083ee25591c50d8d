# Machine holds (config `holds`): named parts of the DAG, each self-contained on a fresh machine at one commit,
# for a GPU machine lent for less time than the whole DAG takes: `snakemake hold_<name>` (on the H200:
# `workflow/scripts/h200_rl.sh start hold_<name>`). What a part needs upstream — the data, the kernels check, the
# base model — runs in it too. An item of a hold is
#   a rule without wildcards          its outputs (a target rule such as `scale`: its inputs)
#   rl:<run>                          the RL run's outputs and its lm-eval jobs
#   scale:<size>                      that size's measurement (and SFT) of the scale sweep
# The holds' results together make the report (`minite report` over them; results/h200/PLAN.md).
# Include last (hold_inputs, common.smk, reads every stage's rules).


for _hold, _items in config["holds"].items():

    rule:
        name:
            f"hold_{_hold}"
        input:
            hold_inputs(_hold, _items),
