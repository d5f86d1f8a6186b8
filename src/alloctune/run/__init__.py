"""`run` / `record`: a workload run under the agent, one fresh process (group) per trial.

    runner.py   one trial: environment, start, every way out, outcome (`run_trial`)
    process.py  the process group of a trial: start it, end it on every way out
    reports.py  reading and classifying the agents' `report.<pid>.json` files
    trial.py    `TrialResult`, one trial's evidence as plain data (what `tune` reads)
    ranks.py    one row per rank of a multi-process job, worst outcome, neediest rank
    ports.py    each trial its own rendezvous port
    record.py   `alloctune record`: recordings at one or several input sizes

Submodules are imported by name; this package imports nothing so `import alloctune.run.trial`
stays free of the runner's process machinery.
"""
