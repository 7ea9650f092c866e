"""Scale-out: Ray rollout workers (``ray_rollout``), Ray sub-agent actors for the swarm (``ray_subagents``) and
the torch.distributed data-parallel learner (``ddp``).

Nothing here is imported by ``import taskrl``: Ray and torch.distributed load only when a run asks for them
(``placement.ray``, ``SwarmEnvConfig.subagent_backend = "ray"``, a multi-process learner).
"""
