"""RL algorithms, one self-contained file each, plus schedules."""
