"""Training internals: config (TrainConfig), batching, the learner, checkpoints, run-directory resume, data.

The loop itself is ``taskrl.training.trainer``; ``taskrl train CONFIG.toml`` is its command line.
"""
