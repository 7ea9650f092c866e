"""Serving trained policies and learning from production (Composer 2's real-time RL loop).

``server`` (OpenAI-compatible, streaming, tools), ``store`` (interactions, feedback, decisions in SQLite or
PostgreSQL), ``feedback`` (signals -> rewards), ``router`` (canary, holdout, shadow, rollback), ``gate``
(bootstrap regression test, N consecutive wins), ``dataset`` (store -> trajectories), ``cycle`` (the loop);
``generation`` (edge validation and one served turn), ``spool`` (outage spool), ``limits`` (per-tenant 429s),
``metrics`` (Prometheus), ``thread`` (uvicorn with a SIGTERM drain; the test-server thread).
"""
