"""A fleet campaign: one campaign over many devices at once. `devices` finds its devices and plans over them,
`run` opens them and chooses or creates the folder, `rounds` runs them through `scheduler` (one worker per
device, one writer), `progress` draws them live, and `bench_sched` measures how far one harness process goes on
simulated devices. harness.campaigns.runner hands a fleet campaign to `run`; nothing here imports the runner
but `bench_sched`, which measures it."""
