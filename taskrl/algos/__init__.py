"""RL algorithms as formulas, one file each: ``grpo``, ``ppo`` (GAE, value loss), ``cispo``, ``kimi``, ``sft``;
shared loss pieces in ``losses``; step schedules in ``schedules``. ``taskrl.training.learner`` applies them."""
