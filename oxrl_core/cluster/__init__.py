"""The run's cluster: where its trainer ranks and vLLM engines live, decided once per run, and how its processes
are started, placed and watched.

`placement.decide` is the rule (a pure function of the run's `PlacementRequest` and the GPU count);
`session.ray_cluster` starts or joins Ray and reserves the run's placement groups (`bundles.Reservation`); the loops
pass the resulting `Placement` to the training group and the rollout pool and never count GPUs themselves.
`watchdog` gives every wait on the run's actors a deadline, `process` sets up an actor's process (its log, its
stacks on request), and `shield` starts Ray's processes with SIGTERM blocked, so that a signal to a whole job stops
the driver alone, which saves first. How weights travel follows from the placement: CUDA IPC between processes on one GPU
(colocated), else a process group from trainer rank 0 to every engine worker (`oxrl_core/weights/transport.py`).

- colocated: bundle i is one GPU holding trainer rank i and engine worker i (an engine of tensor parallelism t
  spans t consecutive bundles);
- split: the trainer ranks' bundles, then each engine's own t bundles on one node;
- an LLM judge (`reward.func: judge`): a bundle of its own, or (`reward.judge.placement: colocated`, GPUs only) a
  share of bundle 0.

On CPU the bundles are CPU slots and the weights always travel through the process group (gloo).
"""
